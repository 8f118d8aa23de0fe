#include <gtest/gtest.h>

#include "sim/check.hpp"
#include "sim/cluster.hpp"
#include "sim/strategy.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

Strategy base() {
  Strategy s;
  s.dp = 4;
  s.tp = 2;
  s.pp = 2;
  s.micro_batch = 2;
  s.global_batch = 64;
  s.seq_len = 2048;
  return s;
}

TEST(Strategy, DerivedSizes) {
  Strategy s = base();
  EXPECT_EQ(s.gpus(), 16);
  EXPECT_EQ(s.micro_batches(), 8);  // 64 / (4 * 2)
}

TEST(Strategy, ValidLayoutPasses) { EXPECT_FALSE(validate(base(), testing::gpt(24, 2048, 16))); }

TEST(Strategy, EachRuleNamesItsFlag) {
  const ModelSpec m = testing::gpt(24, 2048, 16);
  struct Case {
    void (*edit)(Strategy&);
    const char* starts;
  };
  const Case cases[] = {
      {[](Strategy& s) { s.tp = 3; }, "--tp 3: must divide the model's heads (16)"},
      {[](Strategy& s) { s.global_batch = 65; }, "--global-batch 65: must be divisible by dp x micro-batch"},
      {[](Strategy& s) { s.zero = 4; }, "--zero 4"},
      {[](Strategy& s) { s.vp = 2; }, "--vp 2: must be 1 unless --schedule interleaved"},
      {[](Strategy& s) { s.cp = 3; }, "--cp 3: 2 x cp must divide the sequence length"},
      {[](Strategy& s) { s.tp = 1; s.sequence_parallel = true; }, "--sequence-parallel on: needs --tp > 1"},
      {[](Strategy& s) { s.pp = 32; }, "--pp 32: pp x vp (32) must not exceed the model's layers (24)"},
      {[](Strategy& s) { s.schedule = ScheduleKind::interleaved; s.vp = 1; }, "--vp 1: must be >= 2"},
      {[](Strategy& s) { s.schedule = ScheduleKind::interleaved; s.vp = 2; s.global_batch = 8 * 3; s.micro_batch = 2; },
       "--global-batch 24: interleaving needs micro-batches per replica (3) divisible by pp (2)"},
  };
  for (const auto& c : cases) {
    Strategy s = base();
    c.edit(s);
    auto err = validate(s, m);
    ASSERT_TRUE(err.has_value()) << c.starts;
    EXPECT_EQ(err->rfind(c.starts, 0), 0u) << *err;
  }
}

TEST(Strategy, KvHeadsMustBeDivisibleByTp) {
  ModelSpec m = testing::gpt(24, 4096, 32);
  m.kv_heads = 4;
  Strategy s = base();
  s.tp = 8;
  s.dp = 1;
  s.global_batch = 16;
  auto err = validate(s, m);
  ASSERT_TRUE(err);
  EXPECT_NE(err->find("kv_heads (4)"), std::string::npos);
}

TEST(Strategy, JsonRoundTrip) {
  Strategy s = base();
  s.recompute = Recompute::selective;
  s.schedule = ScheduleKind::gpipe;
  s.dtype = Dtype::fp16;
  s.attention = Attention::standard;
  s.order = {Dim::tp, Dim::dp, Dim::cp, Dim::pp};
  Strategy back = strategy_from_json(to_json(s), "plan.json");
  EXPECT_EQ(to_json(back), to_json(s));
  EXPECT_FALSE(to_json(s).contains("pipeline_accounts"));  // written only where set
  s.pipeline_accounts = kAccountEmbedding | kAccountLoss;
  EXPECT_EQ(to_json(s).at("pipeline_accounts"), "embedding,loss");
  EXPECT_EQ(strategy_from_json(to_json(s), "plan.json").pipeline_accounts, s.pipeline_accounts);
  s.pipeline_accounts = kAccountLayers;  // Megatron-core's default even split
  EXPECT_EQ(to_json(s).at("pipeline_accounts"), "layers");
  EXPECT_EQ(strategy_from_json(to_json(s), "plan.json").pipeline_accounts, kAccountLayers);
  nlohmann::json j = to_json(s);
  j["pipeline_accounts"] = "embedding,head";
  EXPECT_THROW(strategy_from_json(j, "plan.json"), InputError);
  EXPECT_FALSE(to_json(s).contains("cuda_graphs"));  // written only where set
  s.cuda_graphs = CudaGraphs::full;
  EXPECT_EQ(to_json(s).at("cuda_graphs"), "full");
  EXPECT_EQ(strategy_from_json(to_json(s), "plan.json").cuda_graphs, CudaGraphs::full);
  EXPECT_NE(describe(s).find(" graphs"), std::string::npos);
  j = to_json(s);
  j["cuda_graphs"] = "layers";
  EXPECT_THROW(strategy_from_json(j, "plan.json"), InputError);
  s.cuda_graphs = CudaGraphs::none;
  EXPECT_FALSE(to_json(s).contains("cuda_graph_modules"));  // written only where set
  s.cuda_graph_modules = kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess;
  EXPECT_EQ(to_json(s).at("cuda_graph_modules"), "attn,moe_router,moe_preprocess");
  EXPECT_EQ(strategy_from_json(to_json(s), "plan.json").cuda_graph_modules, s.cuda_graph_modules);
  EXPECT_NE(describe(s).find(" graphs:attn,moe_router,moe_preprocess"), std::string::npos) << describe(s);
  j = to_json(s);
  j["cuda_graph_modules"] = "attn,router";
  EXPECT_THROW(strategy_from_json(j, "plan.json"), InputError);
}

TEST(Strategy, CudaGraphModulesParseAsMegatronNamesThem) {
  EXPECT_EQ(parse_cuda_graph_modules("attn,mlp"), kGraphAttn | kGraphMlp);
  EXPECT_EQ(parse_cuda_graph_modules("moe"), kGraphMoe);
  EXPECT_EQ(parse_cuda_graph_modules("none"), 0u);
  EXPECT_EQ(parse_cuda_graph_modules(""), 0u);
  EXPECT_FALSE(parse_cuda_graph_modules("full").has_value());  // the whole iteration is --cuda-graphs full
  EXPECT_FALSE(parse_cuda_graph_modules("attn,").has_value());
  EXPECT_EQ(cuda_graph_modules_string(kGraphMoePreprocess | kGraphMoeRouter), "moe_router,moe_preprocess");
}

TEST(Strategy, JsonRejectsBadRankOrder) {
  auto j = to_json(base());
  j["rank_order"] = {"tp", "tp", "dp", "pp"};
  try {
    strategy_from_json(j, "plan.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.json: strategy.rank_order"), std::string::npos) << e.what();
  }
}

TEST(Strategy, JsonRejectsUnknownKey) {
  auto j = to_json(base());
  j["pipeline"] = 3;
  EXPECT_THROW(strategy_from_json(j, "plan.json"), InputError);
}

TEST(Strategy, Describe) {
  Strategy s = base();
  s.sequence_parallel = true;
  EXPECT_EQ(describe(s), "dp4 tp2 pp2 zero0 mb2 none 1f1b sp");
}

TEST(Strategy, DataParallelAlgorithmSpellings) {
  for (const char* a : {"allreduce", "ps", "ps-async"}) EXPECT_STREQ(to_string(*parse_dp_algorithm(a)), a);
  EXPECT_FALSE(parse_dp_algorithm("ring"));
  EXPECT_EQ(to_string(*parse_ps_placement("colocated")), std::string("colocated"));
  EXPECT_FALSE(parse_ps_placement(""));
  EXPECT_EQ(*parse_grad_compression("powersgd:8"), (GradCompression{CompressionKind::powersgd, 8}));
  EXPECT_EQ(to_string(GradCompression{CompressionKind::powersgd, 8}), "powersgd:8");
  EXPECT_EQ(*parse_grad_compression("bf16"), (GradCompression{CompressionKind::bf16, 0}));
  EXPECT_EQ(*parse_grad_compression("none"), GradCompression{});
  for (const char* bad : {"powersgd", "powersgd:", "powersgd:0", "powersgd:-1", "powersgd:2x", "powersgd: 2",
                          "powersgd:65537", "fp16", "bf16:2"}) {
    EXPECT_FALSE(parse_grad_compression(bad)) << bad;
  }
}

TEST(Strategy, ServerAndCompressionRulesNameTheirFlag) {
  const ModelSpec m = testing::gpt(24, 2048, 16);
  auto rule = [&](auto change) {
    Strategy s = base();
    change(s);
    auto why = validate(s, m);
    return why ? *why : std::string();
  };
  EXPECT_EQ(rule([](Strategy& s) { s.dp_algorithm = DpAlgorithm::ps; }), "");
  EXPECT_EQ(rule([](Strategy& s) { s.ps_servers = 0; }).rfind("--ps-servers 0: must be >= 1", 0), 0u);
  EXPECT_EQ(rule([](Strategy& s) { s.ps_servers = 2; }).rfind("--ps-servers 2: needs --dp-algorithm", 0), 0u);
  EXPECT_EQ(rule([](Strategy& s) { s.ps_placement = PsPlacement::colocated; }).rfind("--ps-placement", 0), 0u);
  EXPECT_EQ(rule([](Strategy& s) { s.dp_algorithm = DpAlgorithm::ps_async, s.zero = 1; }).rfind("--dp-algorithm ps-async", 0), 0u);
  EXPECT_EQ(rule([](Strategy& s) { s.grad_compression = {CompressionKind::powersgd, 0}; })
                .rfind("--grad-compression powersgd:0: PowerSGD rank must be >= 1", 0),
            0u);
  EXPECT_EQ(rule([](Strategy& s) { s.grad_compression = {CompressionKind::powersgd, 4}, s.zero = 2; })
                .rfind("--grad-compression powersgd:4: needs --zero 0", 0),
            0u);
  EXPECT_EQ(rule([](Strategy& s) { s.grad_compression = {CompressionKind::bf16, 0}; }).rfind("--grad-compression bf16", 0), 0u);
  EXPECT_EQ(rule([](Strategy& s) { s.grad_compression = {CompressionKind::bf16, 0}, s.fp32_grad_accum = true; }), "");
}

TEST(Strategy, ServerNodesMustFitTheCluster) {
  Cluster c;
  c.name = "small";
  c.gpus_per_node = 8;
  c.network = {{"net", 64, 50e9, 0, 1}};  // 8 nodes
  Strategy s = base();  // 16 GPUs: 2 nodes
  s.dp_algorithm = DpAlgorithm::ps;
  s.ps_servers = 6;
  EXPECT_FALSE(validate_on(s, c));  // 2 + 6 = 8 nodes
  s.ps_servers = 7;
  EXPECT_EQ(validate_on(s, c).value_or("").rfind("--ps-servers 7: dedicated servers need nodes", 0), 0u);
  s.ps_placement = PsPlacement::colocated;
  EXPECT_EQ(validate_on(s, c).value_or("").rfind("--ps-servers 7: colocated servers must not exceed the job's nodes (2)", 0), 0u);
  s.ps_servers = 2;
  EXPECT_FALSE(validate_on(s, c));
}

TEST(Strategy, DefaultDataParallelKeysStayOutOfTheJson) {
  const auto plain = to_json(base());
  for (const char* k : {"dp_algorithm", "ps_servers", "ps_placement", "grad_compression"}) EXPECT_FALSE(plain.contains(k)) << k;
  Strategy s = base();
  s.dp_algorithm = DpAlgorithm::ps_async;
  s.ps_servers = 3;
  s.ps_placement = PsPlacement::colocated;
  s.grad_compression = {CompressionKind::powersgd, 2};
  const auto j = to_json(s);
  EXPECT_EQ(j["dp_algorithm"], "ps-async");
  EXPECT_EQ(j["grad_compression"], "powersgd:2");
  const Strategy back = strategy_from_json(j, "plan.json");
  EXPECT_EQ(back.dp_algorithm, DpAlgorithm::ps_async);
  EXPECT_EQ(back.ps_servers, 3);
  EXPECT_EQ(back.ps_placement, PsPlacement::colocated);
  EXPECT_EQ(back.grad_compression, s.grad_compression);
  EXPECT_EQ(describe(s), "dp4 tp2 pp2 zero0 mb2 none 1f1b ps-async3c powersgd:2");
  auto bad = j;
  bad["grad_compression"] = "powersgd:0";
  EXPECT_THROW(strategy_from_json(bad, "plan.json"), InputError);
}

}  // namespace
}  // namespace trainplan

namespace trainplan {
namespace {

using nlohmann::json;

Strategy base_dense() {
  Strategy s;
  s.dp = 4;
  s.tp = 2;
  s.pp = 2;
  s.micro_batch = 2;
  s.global_batch = 64;
  s.seq_len = 2048;
  return s;
}

// An MoE model of 4 layers with 64 experts of width 256 (top 8) and a shared expert of 512.
ModelSpec moe_model() {
  ModelSpec m = testing::gpt(4, 1024, 16);
  m.norm = Norm::rmsnorm;
  m.activation = Activation::swiglu;
  m.moe.experts = 64;
  m.moe.top_k = 8;
  m.moe.expert_ffn = 256;
  m.moe.shared_experts = 1;
  m.moe.shared_ffn = 512;
  return m;
}

Strategy moe_base() {
  Strategy s;
  s.dp = 8;
  s.tp = 2;
  s.pp = 2;
  s.ep = 8;
  s.sequence_parallel = true;
  s.global_batch = 64;
  s.seq_len = 2048;
  return s;
}

// Megatron-core's folding rule: the experts of a stage lie over its tp x cp x dp ranks again as
// etp x ep x edp; edp = tp cp dp / (etp ep) = 2 x 1 x 8 / (1 x 8) = 2.
TEST(StrategyExperts, FoldingRule) {
  const ModelSpec m = moe_model();
  Strategy s = moe_base();
  EXPECT_FALSE(validate(s, m));
  EXPECT_EQ(s.edp(), 2);
  s.ep = 16;  // 16 experts ranks over 16 dense ranks: edp 1
  EXPECT_FALSE(validate(s, m));
  EXPECT_EQ(s.edp(), 1);
  s.etp = 2;  // 2 x 16 = 32 does not divide 16
  EXPECT_EQ(*validate(s, m),
            "--ep 16: etp x ep (2 x 16) must divide a pipeline stage's tp x cp x dp (2 x 1 x 8): the experts fold over "
            "its ranks, edp = tp x cp x dp / (etp x ep)");
}

TEST(StrategyExperts, EachRuleNamesItsFlag) {
  const ModelSpec m = moe_model();
  struct Case {
    void (*edit)(Strategy&);
    const char* message;
  };
  const Case cases[] = {
      {[](Strategy& s) { s.ep = 3; }, "--ep 3: must divide the model's experts (64)"},
      {[](Strategy& s) { s.etp = 3; }, "--ep 8: etp x ep (3 x 8) must divide a pipeline stage's tp x cp x dp (2 x 1 x 8): "
                                       "the experts fold over its ranks, edp = tp x cp x dp / (etp x ep)"},
      {[](Strategy& s) { s.etp = 2, s.ep = 4, s.dp = 4, s.global_batch = 64; }, nullptr},
      {[](Strategy& s) { s.sequence_parallel = false; },
       "--sequence-parallel off: an MoE model with --tp > 1 needs sequence parallelism (Megatron-LM)"},
      {[](Strategy& s) { s.dtype = Dtype::fp16; },
       "--dtype fp16: expert parallelism is not supported with fp16 (Megatron-LM); use bf16"},
      {[](Strategy& s) { s.moe_imbalance = 0.9; },
       "--moe-imbalance 0.9: must be in [1, ep] = [1, 8] (max / mean tokens per expert-parallel rank)"},
      {[](Strategy& s) { s.moe_imbalance = 9; },
       "--moe-imbalance 9: must be in [1, ep] = [1, 8] (max / mean tokens per expert-parallel rank)"},
      {[](Strategy& s) { s.capacity_factor = 9; }, "--capacity-factor 9: must be in (0, experts / top_k] = (0, 8] (0: dropless)"},
      {[](Strategy& s) { s.recompute_modules = kRecomputeMlaUpProj; },
       "--recompute-modules mla_up_proj: needs a model with multi-head latent attention"},
      {[](Strategy& s) { s.recompute = Recompute::full, s.recompute_modules = kRecomputeMoeAct; },
       "--recompute-modules moe_act: full recomputation already recomputes every module"},
      {[](Strategy& s) { s.order = {Dim::tp, Dim::cp, Dim::pp, Dim::dp}; },
       "--rank-order tp,cp,pp,dp: the expert ranks (etp x ep x edp) must give the same pipeline groups as the dense "
       "ones (Megatron-core): order pp after tp, cp and dp"},
  };
  for (const Case& c : cases) {
    Strategy s = moe_base();
    c.edit(s);
    const auto why = validate(s, m);
    if (!c.message) {
      EXPECT_FALSE(why) << *why;
      continue;
    }
    ASSERT_TRUE(why) << c.message;
    EXPECT_EQ(*why, c.message);
  }
  // A shared expert wider than the TP split allows.
  ModelSpec odd = m;
  odd.moe.shared_ffn = 511;
  EXPECT_EQ(*validate(moe_base(), odd), "--tp 2: must divide the shared experts' width (511)");
  // With tp 1 and the pipeline last, tp, pp, cp, dp orders are fine when they number alike.
  Strategy flat = moe_base();
  flat.tp = 1, flat.dp = 16, flat.sequence_parallel = false;
  flat.order = {Dim::tp, Dim::cp, Dim::dp, Dim::pp};
  EXPECT_FALSE(validate(flat, m));
}

TEST(StrategyExperts, ExpertFlagsOfADenseModelAreRefused) {
  const ModelSpec m = testing::gpt(24, 2048, 16);
  Strategy s = base_dense();
  s.ep = 2;
  EXPECT_EQ(*validate(s, m), "--ep 2: needs a model with experts (the model is dense)");
  s = base_dense();
  s.capacity_factor = 1.25;
  EXPECT_EQ(*validate(s, m), "--capacity-factor 1.25: needs a model with experts (the model is dense)");
  s = base_dense();
  s.dispatcher = Dispatcher::allgather;
  EXPECT_EQ(*validate(s, m), "--moe-dispatcher allgather: needs a model with experts (the model is dense)");
}

TEST(StrategyExperts, JsonCarriesTheExpertFieldsOnlyWhenSet) {
  const json plain = to_json(base_dense());
  for (const char* key : {"ep", "etp", "moe_imbalance", "moe_dispatcher", "capacity_factor", "recompute_modules"})
    EXPECT_FALSE(plain.contains(key)) << key;
  Strategy s = moe_base();
  s.etp = 2;
  s.moe_imbalance = 1.5;
  s.dispatcher = Dispatcher::allgather;
  s.capacity_factor = 1.25;
  s.recompute_modules = kRecomputeMoeAct | kRecomputeMlaUpProj;
  const json j = to_json(s);
  EXPECT_EQ(j["ep"], 8);
  EXPECT_EQ(j["recompute_modules"], "moe_act,mla_up_proj");
  const Strategy back = strategy_from_json(j, "p.json");
  EXPECT_EQ(to_json(back), j);
  EXPECT_EQ(back.ep, 8);
  EXPECT_EQ(back.etp, 2);
  EXPECT_EQ(back.dispatcher, Dispatcher::allgather);
  EXPECT_EQ(describe(s), "dp8 tp2 pp2 zero0 mb1 none 1f1b sp ep8 etp2 imb1.5 cf1.25 allgather rc:moe_act,mla_up_proj");
  json bad = j;
  bad["recompute_modules"] = "moe_act,core";
  EXPECT_EQ(testing::input_error([&] { strategy_from_json(bad, "p.json"); }),
            "p.json: strategy.recompute_modules = \"moe_act,core\", must list moe_act, mla_up_proj, layernorm, mlp (comma-separated)");
  EXPECT_EQ(parse_recompute_modules("none"), 0u);
  EXPECT_FALSE(parse_recompute_modules("moe_act,"));
  // The same list split at its commas (as the command line splits it): "none" only alone.
  EXPECT_EQ(parse_recompute_module_items({"none"}), 0u);
  EXPECT_EQ(parse_recompute_module_items({"layernorm", "moe_act"}), kRecomputeMoeAct | kRecomputeLayernorm);
  EXPECT_FALSE(parse_recompute_module_items({"none", "moe_act"}));
  EXPECT_FALSE(parse_recompute_module_items({"moe_act", ""}));
  EXPECT_EQ(parse_pipeline_account_items({"loss", "embedding"}), kAccountEmbedding | kAccountLoss);
  EXPECT_FALSE(parse_pipeline_account_items({"embedding", "core"}));
}

}  // namespace
}  // namespace trainplan

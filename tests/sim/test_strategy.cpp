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

// Mixture-of-experts and latent-attention models: the Hugging Face families with experts
// (sim/hf_families.cpp), the trainplan model-file keys for them (sim/model_families.cpp), the
// shipped MoE models against their published parameter counts, and the layer kinds the layer graph
// derives from them.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "sim/check.hpp"
#include "sim/json_reader.hpp"
#include "sim/layer_graph.hpp"
#include "sim/model_spec.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

using nlohmann::json;
using testing::Contains;
using testing::input_error;
namespace fs = std::filesystem;

const fs::path kSource = TRAINPLAN_SOURCE_DIR;
const std::string kHf = std::string(TRAINPLAN_TEST_DATA_DIR) + "/hf/";

ModelSpec hf(const std::string& folder) { return load_model(kHf + folder + "/config.json", kSource); }

// ---- published parameter counts ----------------------------------------------------------------

// The shipped files against their publishers' totals and active counts. Conventions differ: Mistral,
// Qwen and DeepSeek count the embedding table in the active parameters (ParamCounts::active);
// OpenAI's gpt-oss card counts active parameters without it (Table 1: 5.13B = MLP 114.71B x 4/128
// + attention 0.96B + unembedding 0.58B), so gpt-oss is checked as active - embedding.
// Two publishers give the active count to two digits, cut rather than rounded: DeepSeek-V3's
// "37B" (our 37.55B, +1.5%) and Qwen3-30B-A3B's "3.3B" (our 3.353B, +1.6%; its card's 29.9B
// non-embedding and 30.5B total match to 0.2%). Those two are held to 2% and to the published
// digits (37.55 cuts to 37, 3.353 to 3.3); every other figure to 1%.
struct Published {
  const char* name;
  double total, active;
  bool active_without_embedding;
  double active_tolerance;
};

class PublishedMoeCounts : public ::testing::TestWithParam<Published> {};

TEST_P(PublishedMoeCounts, TotalAndActiveMatchThePublisher) {
  const Published& p = GetParam();
  const ModelSpec m = load_model(p.name, kSource);
  const ParamCounts c = LayerGraph(m, m.seq_len).counts();
  const double active = p.active_without_embedding ? c.active - c.embedding : c.active;
  std::printf("%-16s total %8.3fB (published %6.1fB, %+.2f%%)  active %7.3fB (published %5.2fB, %+.2f%%)\n", p.name,
              c.total / 1e9, p.total / 1e9, 100 * (c.total / p.total - 1), active / 1e9, p.active / 1e9,
              100 * (active / p.active - 1));
  EXPECT_NEAR(c.total / p.total, 1.0, 0.01) << p.name;
  EXPECT_NEAR(active / p.active, 1.0, p.active_tolerance) << p.name;
  EXPECT_LT(c.active, c.total);
}

INSTANTIATE_TEST_SUITE_P(
    Published, PublishedMoeCounts,
    ::testing::Values(Published{"deepseek-v3", 671e9, 37e9, false, 0.02},
                      Published{"qwen3-235b-a22b", 235e9, 22e9, false, 0.01},
                      Published{"qwen3-30b-a3b", 30.5e9, 3.3e9, false, 0.02},
                      Published{"gpt-oss-120b", 116.83e9, 5.13e9, true, 0.01},
                      Published{"mixtral-8x7b", 46.7e9, 12.9e9, false, 0.01}),
    [](const auto& info) {
      std::string n = info.param.name;
      for (char& ch : n)
        if (ch == '-' || ch == '.') ch = '_';
      return n;
    });

// The two-digit figures cut, not rounded: 37.55B -> "37B", 3.353B -> "3.3B".
TEST(PublishedMoeCounts, TwoDigitActiveCountsAreTheFiguresCut) {
  for (auto [name, digits] : {std::pair{"deepseek-v3", 1e9}, std::pair{"qwen3-30b-a3b", 1e8}}) {
    const ModelSpec m = load_model(name, kSource);
    const double active = LayerGraph(m, m.seq_len).counts().active;
    EXPECT_EQ(std::floor(active / digits), name == std::string("deepseek-v3") ? 37 : 33) << name;
  }
}

// DeepSeek-V3 by hand (h 7168, 61 layers, 3 dense):
//   MLA a layer: q_down 7168 x 1536, q_up 1536 x 128 x 192, kv_down 7168 x 576, kv_up 512 x 128 x 256,
//     output 128 x 128 x 7168, norms 1536 + 512 + 2 x 7168 = 187,121,664;
//   dense MLP 3 x 7168 x 18432 = 396,361,728; an expert 3 x 7168 x 2048 = 44,040,192; router 7168 x 256;
//   total 3 x 583,483,392 + 58 x (187,121,664 + 257 x 44,040,192 + 1,835,008) + 2 x 129280 x 7168 + 7168
//   = 671,026,404,352; MTP: 2 norms, 2 x 7168^2, one MoE layer, its final norm = 11,610,146,304.
TEST(PublishedMoeCounts, DeepSeekV3ByHand) {
  const ModelSpec m = load_model("deepseek-v3", kSource);
  const ParamCounts c = LayerGraph(m, 4096).counts();
  EXPECT_DOUBLE_EQ(c.total, 671026404352.0);
  EXPECT_DOUBLE_EQ(c.expert, 58.0 * 256 * 44040192);
  EXPECT_DOUBLE_EQ(c.mtp, 2 * 7168 + 2.0 * 7168 * 7168 + (187121664 + 257.0 * 44040192 + 1835008) + 7168);
}

// ---- Hugging Face configs -----------------------------------------------------------------------

TEST(HfMoe, EachConfigIsTheShippedModel) {
  for (auto [folder, builtin] : {std::pair{"deepseek-v3", "deepseek-v3"}, std::pair{"qwen3-30b-a3b", "qwen3-30b-a3b"},
                                 std::pair{"mixtral-8x7b", "mixtral-8x7b"}, std::pair{"gpt-oss-120b", "gpt-oss-120b"}}) {
    const ModelSpec a = hf(folder), b = load_model(builtin, kSource);
    json ja = to_json(a), jb = to_json(b);
    ja.erase("name"), jb.erase("name");
    EXPECT_EQ(ja, jb) << folder;
  }
}

TEST(HfMoe, DeepSeekV3Fields) {
  const ModelSpec m = hf("deepseek-v3");
  EXPECT_EQ(m.mla.q_lora_rank, 1536);
  EXPECT_EQ(m.mla.kv_lora_rank, 512);
  EXPECT_EQ(m.head_dim(), 192);
  EXPECT_EQ(m.moe.experts, 256);
  EXPECT_EQ(m.moe.top_k, 8);
  EXPECT_EQ(m.moe.shared_experts, 1);
  EXPECT_EQ(m.moe.scoring, RouterScoring::sigmoid);
  EXPECT_EQ(m.moe.groups, 8);
  EXPECT_EQ(m.moe.topk_groups, 4);
  EXPECT_EQ(m.mtp_layers, 1);
  EXPECT_FALSE(m.is_moe_layer(2));
  EXPECT_TRUE(m.is_moe_layer(3));
  EXPECT_TRUE(m.is_moe_layer(60));
  // kimi_k2 is read as deepseek_v3; moe_layer_freq 2 makes every odd layer from 3 on dense.
  json j = read_json_file(kHf + "deepseek-v3/config.json");
  j["model_type"] = "kimi_k2";
  j["moe_layer_freq"] = 2;
  const ModelSpec k = parse_hf_config(j, "kimi/config.json");
  EXPECT_TRUE(k.is_moe_layer(4));
  EXPECT_FALSE(k.is_moe_layer(5));
  EXPECT_FALSE(k.is_moe_layer(2));
}

TEST(HfMoe, GptOssAlternatesSlidingAndFullAttention) {
  const ModelSpec m = hf("gpt-oss-120b");
  EXPECT_EQ(m.sliding_window, 128);
  EXPECT_TRUE(m.attention_sinks);
  EXPECT_EQ(m.layer_attention_at(0, 4096), AttentionWindow::sliding);
  EXPECT_EQ(m.layer_attention_at(1, 4096), AttentionWindow::full);
  EXPECT_EQ(m.layer_attention_at(35, 4096), AttentionWindow::full);
  // A window as long as the sequence is full attention.
  EXPECT_EQ(m.layer_attention_at(0, 128), AttentionWindow::full);
  const LayerGraph g(m, 4096);
  ASSERT_EQ(g.kind_count(), 2);
  EXPECT_EQ(g.kind(0), (LayerKind{true, AttentionWindow::sliding}));
  EXPECT_EQ(g.kind(1), (LayerKind{true, AttentionWindow::full}));
  const auto counts = g.kind_counts(0, 36);
  EXPECT_EQ(counts[0], 18);
  EXPECT_EQ(counts[1], 18);
  EXPECT_EQ(g.kind_counts(3, 4)[0], 2);  // layers 4 and 6
  // experts_per_token must agree with num_experts_per_tok.
  json j = read_json_file(kHf + "gpt-oss-120b/config.json");
  j["experts_per_token"] = 2;
  EXPECT_EQ(input_error([&] { parse_hf_config(j, "g.json"); }),
            "g.json: experts_per_token = 2, must equal num_experts_per_tok (4)");
}

// GptOssExperts clamps gate and up to swiglu_limit: read where given, GptOssConfig's 7.0 where not.
TEST(HfMoe, GptOssReadsItsSwigluLimit) {
  EXPECT_EQ(hf("gpt-oss-120b").activation_clamp, 7.0);
  json j = read_json_file(kHf + "gpt-oss-120b/config.json");
  j["swiglu_limit"] = 5.5;
  EXPECT_EQ(parse_hf_config(j, "g.json").activation_clamp, 5.5);
  j.erase("swiglu_limit");
  EXPECT_EQ(parse_hf_config(j, "g.json").activation_clamp, 7.0);
  j["swiglu_limit"] = nullptr;
  EXPECT_EQ(parse_hf_config(j, "g.json").activation_clamp, 7.0);
}

// rope_scaling's YaRN attention factor (transformers' _compute_yarn_parameters): gpt-oss's factor 32
// without mscale gives 0.1 ln 32 + 1, the built-in file's 1.3466; DeepSeek-V3's mscale and
// mscale_all_dim (both 1.0) cancel; Llama 4's llama3 scaling changes frequencies only.
TEST(HfMoe, RopeScalingGivesYarnsAttentionFactor) {
  EXPECT_NEAR(hf("gpt-oss-120b").rope_attention_factor, 1.34657, 1e-5);
  EXPECT_NEAR(load_model("gpt-oss-120b", kSource).rope_attention_factor, hf("gpt-oss-120b").rope_attention_factor, 1e-4);
  EXPECT_EQ(hf("deepseek-v3").rope_attention_factor, 1.0);
  EXPECT_EQ(hf("llama4-scout").rope_attention_factor, 1.0);
  EXPECT_EQ(hf("qwen3-30b-a3b").rope_attention_factor, 1.0);
  json j = read_json_file(kHf + "gpt-oss-120b/config.json");
  j["rope_scaling"]["mscale"] = 0.707, j["rope_scaling"]["mscale_all_dim"] = 1.0;
  EXPECT_NEAR(parse_hf_config(j, "g.json").rope_attention_factor, (0.0707 * std::log(32.0) + 1) / (0.1 * std::log(32.0) + 1), 1e-9);
  j["rope_scaling"]["attention_factor"] = 1.1;  // given outright, it wins
  EXPECT_EQ(parse_hf_config(j, "g.json").rope_attention_factor, 1.1);
  // transformers 5 writes the same settings as rope_parameters.
  j["rope_parameters"] = j["rope_scaling"];
  j.erase("rope_scaling");
  EXPECT_EQ(parse_hf_config(j, "g.json").rope_attention_factor, 1.1);
  j["rope_scaling"] = nullptr;  // null is absent
  EXPECT_EQ(parse_hf_config(j, "g.json").rope_attention_factor, 1.1);
  j["rope_scaling"] = j["rope_parameters"];
  EXPECT_EQ(input_error([&] { parse_hf_config(j, "g.json"); }).find("g.json: rope_parameters = "), 0u);
  j.erase("rope_parameters");
  j["rope_scaling"]["rope_type"] = "longrope";
  EXPECT_EQ(input_error([&] { parse_hf_config(j, "g.json"); }),
            "g.json: rope_scaling.rope_type = \"longrope\", must be default, linear, dynamic, llama3 or yarn (the rotary "
            "scalings trainplan reads)");
  // Written back to a model file and read again, the factor survives.
  const ModelSpec oss = hf("gpt-oss-120b");
  EXPECT_DOUBLE_EQ(parse_model(to_json(oss), "m.json").rope_attention_factor, oss.rope_attention_factor);
}

TEST(HfMoe, Llama4ReadsItsTextConfig) {
  const ModelSpec m = hf("llama4-scout");
  EXPECT_EQ(m.layers, 48);
  EXPECT_EQ(m.hidden, 5120);
  EXPECT_EQ(m.moe.experts, 16);
  EXPECT_EQ(m.moe.top_k, 1);
  EXPECT_EQ(m.moe.shared_experts, 1);
  EXPECT_EQ(m.moe.shared_ffn, 8192);
  EXPECT_EQ(m.ffn_hidden, 16384);
  EXPECT_EQ(m.moe.scoring, RouterScoring::sigmoid);
  EXPECT_EQ(m.attention_chunk, 8192);
  // Chunked on RoPE layers, full every fourth (the default of an empty no_rope_layers).
  EXPECT_EQ(m.layer_attention_at(0, 16384), AttentionWindow::chunked);
  EXPECT_EQ(m.layer_attention_at(3, 16384), AttentionWindow::full);
  EXPECT_EQ(m.layer_attention_at(0, 8192), AttentionWindow::full);  // the chunk covers the sequence
  // Meta's model card: 109B total (the vision encoder included), 17B active.
  const ParamCounts c = LayerGraph(m, 8192).counts();
  EXPECT_NEAR(c.active / 17e9, 1.0, 0.02);
}

TEST(HfMoe, Qwen2MoeHasAGatedSharedExpertAndSparseSteps) {
  json j = read_json_file(kHf + "qwen3-30b-a3b/config.json");
  j["model_type"] = "qwen2_moe";
  j["shared_expert_intermediate_size"] = 5632;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {5};
  const ModelSpec m = parse_hf_config(j, "q/config.json");
  EXPECT_EQ(m.moe.shared_experts, 1);
  EXPECT_EQ(m.moe.shared_ffn, 5632);
  EXPECT_TRUE(m.moe.shared_gate);
  EXPECT_FALSE(m.is_moe_layer(0));
  EXPECT_TRUE(m.is_moe_layer(1));
  EXPECT_FALSE(m.is_moe_layer(5));  // mlp_only_layers
  EXPECT_TRUE(m.is_moe_layer(7));
}

// A Mixtral config relabelled "mistral" loaded as a 7.24B dense model; every expert key under a
// dense family is now refused with the families that have experts.
TEST(HfMoe, ExpertKeysUnderADenseFamilyAreRefused) {
  json j = read_json_file(kHf + "mixtral-8x7b/config.json");
  j["model_type"] = "mistral";
  const std::string e = input_error([&] { parse_hf_config(j, "m/config.json"); });
  EXPECT_TRUE(Contains(e, "m/config.json: num_local_experts = 8, is a mixture-of-experts or latent-attention key")) << e;
  EXPECT_TRUE(Contains(e, "mixtral|qwen2_moe")) << e;
  json d = read_json_file(kHf + "llama3-8b/config.json");
  d["kv_lora_rank"] = 512;
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(d, "l.json"); }), "l.json: kv_lora_rank = 512")) << "MLA key";
  // A key that says "none" is not a feature: num_experts 0 or null loads as dense.
  d.erase("kv_lora_rank");
  d["num_experts"] = 0;
  EXPECT_FALSE(parse_hf_config(d, "l.json").moe.on());
}

// Each MoE family's reader asks for its own keys; another family's (a Qwen2-MoE shared expert in a
// qwen3_moe config, DeepSeek's dense first layers in a mixtral one) was ignored and changed the
// count silently. A value that sets nothing (0, null, [], a step of 1) still loads.
TEST(HfMoe, AnotherFamilysKeysAreRefused) {
  json q = read_json_file(kHf + "qwen3-30b-a3b/config.json");
  q["shared_expert_intermediate_size"] = 4096;
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(q, "q.json"); }),
                       "q.json: shared_expert_intermediate_size = 4096, is not a key of a qwen3_moe config"));
  q["shared_expert_intermediate_size"] = 0;
  EXPECT_EQ(parse_hf_config(q, "q.json").moe.shared_experts, 0);
  // Nor is a window under a family without one, or another family's layout key.
  json w = read_json_file(kHf + "llama3-8b/config.json");
  w["sliding_window"] = nullptr;
  EXPECT_NO_THROW(parse_hf_config(w, "w.json"));
  w["sliding_window"] = 4096;
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(w, "w.json"); }), "sliding_window = 4096, is not read by a llama model"));
  w.erase("sliding_window");
  w["attention_chunk_size"] = 8192;
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(w, "w.json"); }), "attention_chunk_size = 8192, is not a key of a llama config"));

  json x = read_json_file(kHf + "mixtral-8x7b/config.json");
  x["first_k_dense_replace"] = 3;
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(x, "x.json"); }), "x.json: first_k_dense_replace = 3"));
  x["first_k_dense_replace"] = 0;
  x["decoder_sparse_step"] = 1;
  x["mlp_only_layers"] = json::array();
  EXPECT_EQ(parse_hf_config(x, "x.json").moe.experts, 8);
  json d = read_json_file(kHf + "deepseek-v3/config.json");
  d["mlp_only_layers"] = {5};
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(d, "d.json"); }), "d.json: mlp_only_layers = [5]"));
}

// transformers 5 may save Qwen's expert count as num_local_experts.
TEST(HfMoe, QwenExpertsUnderEitherName) {
  json q = read_json_file(kHf + "qwen3-30b-a3b/config.json");
  q.erase("num_experts");
  q["num_local_experts"] = 128;
  EXPECT_EQ(parse_hf_config(q, "q.json").moe.experts, 128);
  q["num_experts"] = 64;
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(q, "q.json"); }),
                       "q.json: num_local_experts = 128, must equal num_experts (64)"));
}

// transformers saves Llama 4's moe_layers beside the interleave_moe_layer_step it came from
// (Maverick: 2); both load, moe_layers deciding, and neither is refused as unread.
TEST(HfMoe, Llama4MoeLayersBesideTheirStep) {
  json j = read_json_file(kHf + "llama4-scout/config.json");
  j["text_config"]["interleave_moe_layer_step"] = 2;
  std::vector<int> moe;
  for (int l = 1; l < 48; l += 2) moe.push_back(l);
  j["text_config"]["moe_layers"] = moe;
  const ModelSpec m = parse_hf_config(j, "l.json");
  EXPECT_FALSE(m.is_moe_layer(0));
  EXPECT_TRUE(m.is_moe_layer(1));
  j["text_config"]["interleave_moe_layer_step"] = 0;
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(j, "l.json"); }), "text_config.interleave_moe_layer_step = 0"));
}

// Llama 4's text model is read from text_config alone: a text key beside it, which would be
// ignored, is refused.
TEST(HfMoe, Llama4TextKeyBesideTextConfigIsRefused) {
  json j = read_json_file(kHf + "llama4-scout/config.json");
  j["num_hidden_layers"] = 10;
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(j, "l.json"); }),
                       "l.json: num_hidden_layers = 10, belongs in text_config"));
}

// Qwen2's layer_types (Qwen2Config) sets which layers slide where use_sliding_window.
TEST(HfMoe, QwenLayerTypesAreRead) {
  json q = read_json_file(kHf + "qwen2-0.5b/config.json");
  std::vector<std::string> types;
  for (int l = 0; l < 24; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  q["layer_types"] = types;
  EXPECT_TRUE(parse_hf_config(q, "q.json").layer_attention.empty()) << "use_sliding_window false: every layer full";
  q["use_sliding_window"] = true;
  q["sliding_window"] = 1024;
  const ModelSpec m = parse_hf_config(q, "q.json");
  EXPECT_EQ(m.layer_attention, (std::vector<AttentionWindow>{AttentionWindow::sliding, AttentionWindow::full}));
  q["layer_types"][3] = "sliding";
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(q, "q.json"); }), "must hold only sliding_attention|full_attention"));
}

// A family whose model does not read layer_types (llama, mistral, mixtral, deepseek_v3) may still
// carry it as a record of each layer's window: it must agree with what the other keys give.
TEST(HfMoe, LayerTypesOfFamiliesThatDoNotReadItMustAgree) {
  json l = read_json_file(kHf + "llama3-8b/config.json");
  const int layers = l["num_hidden_layers"].get<int>();
  l["layer_types"] = std::vector<std::string>(static_cast<std::size_t>(layers), "full_attention");
  EXPECT_TRUE(parse_hf_config(l, "l.json").layer_attention.empty());
  l["layer_types"][5] = "sliding_attention";
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(l, "l.json"); }),
                       "names sliding attention for layer 5, but a llama model runs full attention there"));
  l["layer_types"] = std::vector<std::string>(3, "full_attention");
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(l, "l.json"); }), "must list one type per layer"));

  json m = read_json_file(kHf + "mistral-7b/config.json");
  const int mistral_layers = m["num_hidden_layers"].get<int>();
  m["layer_types"] = std::vector<std::string>(static_cast<std::size_t>(mistral_layers), "sliding_attention");
  EXPECT_EQ(parse_hf_config(m, "m.json").layer_attention, std::vector<AttentionWindow>{AttentionWindow::sliding});
  m["layer_types"][1] = "full_attention";  // alternating windows: transformers' Ministral, not Mistral
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(m, "m.json"); }),
                       "names full attention for layer 1, but a mistral model runs sliding attention there"));

  json x = read_json_file(kHf + "mixtral-8x7b/config.json");
  x["layer_types"] = std::vector<std::string>(static_cast<std::size_t>(x["num_hidden_layers"].get<int>()), "chunked_attention");
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(x, "x.json"); }), "names chunked attention for layer 0"));
}

// The checks across Llama 4's text fields name them in text_config, where they are ("num_key_value_heads
// must divide heads" named a top-level key the config does not have, without its value).
TEST(HfMoe, Llama4ChecksNameTextConfigFields) {
  json j = read_json_file(kHf + "llama4-scout/config.json");
  j["text_config"]["num_key_value_heads"] = 7;
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(j, "l.json"); }),
                       "l.json: text_config.num_key_value_heads = 7, must divide heads (40)"));
  j["text_config"]["num_key_value_heads"] = 8;
  j["text_config"]["moe_layers"] = json::array();
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(j, "l.json"); }),
                       "l.json: text_config.num_local_experts = 16, no layer is an MoE layer"));
}

// Latent attention rotates only the qk_rope_head_dim channels: that is the one that must be even
// (an odd qk_nope_head_dim is a valid layout), named as such.
TEST(HfMoe, MlaRopePartMustBeEven) {
  json d = read_json_file(kHf + "deepseek-v3/config.json");
  d["qk_rope_head_dim"] = 63;
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(d, "d.json"); }),
                       "d.json: qk_rope_head_dim = 63, must be even"));
  d["qk_rope_head_dim"] = 64;
  d["qk_nope_head_dim"] = 127;
  EXPECT_EQ(parse_hf_config(d, "d.json").head_dim(), 191);
}

TEST(HfMoe, MistralSlidingWindowIsRead) {
  const ModelSpec m = hf("mistral-7b");
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_EQ(m.layer_attention_at(0, 4096), AttentionWindow::full);
  EXPECT_EQ(m.layer_attention_at(0, 8192), AttentionWindow::sliding);
}

// ---- the trainplan model format -----------------------------------------------------------------

json moe_model() {
  return json::parse(R"({"name": "m", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn_hidden": 256,
                         "vocab": 256, "seq_len": 64, "activation": "swiglu", "norm": "rmsnorm",
                         "tied_embeddings": false, "position": "rope",
                         "moe": {"experts": 8, "top_k": 2, "expert_ffn": 32, "shared_experts": 1, "shared_ffn": 32,
                                 "first_dense": 1, "router": "sigmoid", "groups": 4, "topk_groups": 2},
                         "mla": {"q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
                                 "qk_rope_head_dim": 8, "v_head_dim": 16},
                         "layer_attention": ["sliding", "full"], "sliding_window": 16, "mtp_layers": 1})");
}

TEST(MoeModelFile, ReadsAndRoundTrips) {
  const ModelSpec m = parse_model(moe_model(), "m.json");
  EXPECT_EQ(m.moe.experts, 8);
  EXPECT_EQ(m.head_dim(), 24);
  EXPECT_FALSE(m.is_moe_layer(0));
  EXPECT_TRUE(m.is_moe_layer(1));
  const ModelSpec back = parse_model(to_json(m), "back.json");
  EXPECT_EQ(to_json(back), to_json(m));
  EXPECT_EQ(back.moe, m.moe);
  EXPECT_EQ(back.mla, m.mla);
  EXPECT_EQ(back.layer_attention, m.layer_attention);
}

TEST(MoeModelFile, EachBadFieldIsNamed) {
  struct Case {
    const char* pointer;
    json value;
    const char* message;
  };
  const Case cases[] = {
      {"/moe/top_k", 9, "m.json: moe.top_k = 9, must be in [1, 8]"},
      {"/moe/experts", 0, "m.json: moe.experts = 0, must be in [1, 65536]"},
      {"/moe/every", 0, "m.json: moe.every = 0, must be in [1, 4]"},
      {"/moe/dense_layers", json::array({4}), "m.json: moe.dense_layers = [4], must hold layer indices in [0, 3]"},
      {"/moe/router", "relu", "m.json: moe.router = \"relu\", must be one of softmax|sigmoid"},
      {"/moe/groups", 3, "m.json: moe.experts = 8, must be divisible by the router's groups (3)"},
      {"/moe/top_k", 5, "m.json: moe.top_k = 5, must be at most the experts of the best 2 of 4 groups (4)"},
      {"/moe/extra", 1, "m.json: moe.extra is not a known key"},
      {"/kv_heads", 2, "m.json: kv_heads = 2, must equal the heads (4) with multi-head latent attention (each head has "
                       "its own key and value)"},
      {"/layer_attention", json::array({"full", "local"}), "m.json: layer_attention = [\"full\",\"local\"], must hold "
                                                           "only full|sliding|chunked"},
      {"/mtp_layers", 17, "m.json: mtp_layers = 17, must be in [0, 16]"},
  };
  for (const Case& c : cases) {
    json j = moe_model();
    j[json::json_pointer(c.pointer)] = c.value;
    EXPECT_EQ(input_error([&] { parse_model(j, "m.json"); }), c.message) << c.pointer;
  }
  json j = moe_model();
  j["moe"].erase("shared_experts");
  EXPECT_EQ(input_error([&] { parse_model(j, "m.json"); }), "m.json: moe.shared_ffn = 32, needs shared_experts >= 1");
  j = moe_model();
  j.erase("sliding_window");
  EXPECT_EQ(input_error([&] { parse_model(j, "m.json"); }),
            "m.json: sliding_window is required where a layer's attention is sliding");
  j = moe_model();
  j["moe"]["dense_layers"] = {1, 2, 3};
  EXPECT_EQ(input_error([&] { parse_model(j, "m.json"); }),
            "m.json: moe.experts = 8, no layer is an MoE layer (first_dense, every, dense_layers)");
}

// ---- layer kinds --------------------------------------------------------------------------------

TEST(MoeLayerGraph, KindsFollowTheLayers) {
  const ModelSpec m = load_model("deepseek-v3", kSource);
  const LayerGraph g(m, 4096);
  ASSERT_EQ(g.kind_count(), 2);
  EXPECT_FALSE(g.kind(0).moe);
  EXPECT_TRUE(g.kind(1).moe);
  EXPECT_EQ(g.layer_kind(2), 0);
  EXPECT_EQ(g.layer_kind(3), 1);
  EXPECT_EQ(g.kind_counts(0, 61)[0], 3);
  EXPECT_EQ(g.kind_counts(0, 61)[1], 58);
  EXPECT_EQ(g.kind_counts(2, 2)[0], 1);
  EXPECT_EQ(g.mtp_kind(), 1);
  // MLA enters the TP region on its latents (q 1536; kv 512 + the 64 RoPE key dims), leaves on h;
  // the routed experts cross no TP boundary, the shared expert two (h each).
  const LayerBoundaries& b = g.boundaries(1);
  ASSERT_EQ(b.enter, 3);
  EXPECT_DOUBLE_EQ(b.enter_width[0], 1536);
  EXPECT_DOUBLE_EQ(b.enter_width[1], 576);
  EXPECT_DOUBLE_EQ(b.enter_width[2], 7168);
  EXPECT_EQ(b.exit, 2);
  EXPECT_EQ(g.boundaries(0).enter, 3);  // the dense layer: two latents and the MLP
  // Active FLOPs: the router, 8 routed and 1 shared expert of the MoE layer per token.
  double moe_mlp = 0;
  for (const OpSpec& op : g.kind_ops(1))
    if (op.kind == OpKind::router || op.kind == OpKind::expert_up || op.kind == OpKind::expert_down ||
        op.kind == OpKind::shared_up || op.kind == OpKind::shared_down)
      moe_mlp += op.flops_per_token;
  EXPECT_DOUBLE_EQ(moe_mlp, 2.0 * 7168 * 256 + 9 * 6.0 * 7168 * 2048);
  // Routed experts are held by ep x etp ranks; the rest of the layer by TP as before.
  double expert = 0;
  for (const OpSpec& op : g.kind_ops(1))
    if (op.split == Split::expert) expert += op.params;
  EXPECT_DOUBLE_EQ(g.kind_params_per_rank(1, 1, 64), g.kind_params(1) - expert + expert / 64);
}

TEST(MoeLayerGraph, SlidingWindowShrinksTheAttentionFlops) {
  // gpt-oss at s = 4096, W = 128: 2W/s - (W/s)^2 of the full attention's FLOPs.
  const ModelSpec m = load_model("gpt-oss-120b", kSource);
  const LayerGraph g(m, 4096);
  auto attention = [&](int k) {
    for (const OpSpec& op : g.kind_ops(k))
      if (op.kind == OpKind::attention) return op.flops_per_token;
    return 0.0;
  };
  const double share = 2 * 128.0 / 4096 - (128.0 / 4096) * (128.0 / 4096);
  EXPECT_DOUBLE_EQ(attention(0), 4.0 * 4096 * 4096 * share);
  EXPECT_DOUBLE_EQ(attention(1), 4.0 * 4096 * 4096);
}

}  // namespace
}  // namespace trainplan

// Unit tests for sim/model_spec: the shipped model zoo, the trainplan model format, the Hugging
// Face config.json mapping, and every bad input the loader must reject with a one-line message.
#include "sim/model_spec.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "sim/check.hpp"
#include "sim/json_reader.hpp"
#include "sim/layer_graph.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

using testing::Contains;
using testing::input_error;
using testing::StartsWith;

using nlohmann::json;
namespace fs = std::filesystem;

const fs::path kSource = TRAINPLAN_SOURCE_DIR;
const std::string kData = TRAINPLAN_TEST_DATA_DIR;
const std::string kBad = kData + "/bad/";
const std::string kHf = kData + "/hf/";

// Parameter count of a decoder-only transformer, written out here independently of the layer
// graph so that the zoo's figures can be checked against the published totals:
//   embeddings  V·h (+ V·h for an untied LM head) (+ s·h learned positions)
//   attention   h·(a·d + 2·kv·d) for Q,K,V and a·d·h for the output projection (d = head_dim,
//               h/a unless the file sets it)
//   MLP         2·h·f (GELU) or 3·h·f (SwiGLU: gate, up, down)
//   norms       2h per LayerNorm (scale + bias), h per RMSNorm; two per layer plus a final one
//   biases      GPT-style models (LayerNorm) have biases on every linear layer: (a·d + 2·kv·d) + h
//               in attention, f + h in the MLP; Llama-style models (RMSNorm) have none.
double parameters(const ModelSpec& m) {
  const double h = m.hidden, f = m.ffn_hidden, V = m.vocab, kvd = double(m.kv_heads) * m.head_dim();
  const double ad = double(m.heads) * m.head_dim();
  const bool gpt_style = m.norm == Norm::layernorm;
  double embed = V * h * (m.tied_embeddings ? 1 : 2) + (m.position == Position::learned ? m.seq_len * h : 0);
  double attn = h * (ad + 2 * kvd) + ad * h + (gpt_style ? (ad + 2 * kvd) + h : 0);
  double mlp = (m.activation == Activation::swiglu ? 3 : 2) * h * f + (gpt_style ? f + h : 0);
  double norm = gpt_style ? 2 * h : h;
  return embed + m.layers * (attn + mlp + 2 * norm) + norm;
}

// ---- the shipped zoo --------------------------------------------------------------------------

// A software profile's vocab_padding_multiple (up to 2^20) times tp went past an int and wrapped
// to 0: predict --tp 4096 with a multiple of 2^20 died of SIGFPE. The rows are counted in 64 bits.
TEST(PaddedVocab, LargeMultipleTimesTpDoesNotWrap) {
  EXPECT_EQ(padded_vocab(1000, 4096, 1 << 20), 1LL << 32);
  EXPECT_EQ(padded_vocab(1 << 24, 1 << 24, 1 << 20), 1LL << 44);
  EXPECT_EQ(padded_vocab(50257, 1), 50304);
}

TEST(ModelZoo, EveryShippedFileLoadsAndIsNamedLikeItsFile) {
  std::set<std::string> found;
  for (const auto& e : fs::directory_iterator(kSource / "models")) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().string());
    const ModelSpec by_path = load_model(e.path().string(), kSource);
    const ModelSpec by_name = load_model(e.path().stem().string(), kSource);
    EXPECT_EQ(by_path.name, e.path().stem().string());
    EXPECT_EQ(by_name.name, by_path.name);
    EXPECT_EQ(by_name.layers, by_path.layers);
    EXPECT_EQ(by_path.hidden % by_path.heads, 0);
    EXPECT_EQ(by_path.heads % by_path.kv_heads, 0);
    found.insert(by_path.name);
  }
  // The built-in models every release must ship, by name.
  for (const char* required : {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-175b", "llama2-7b",
                               "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-405b",
                               "mistral-7b", "tiny-gpt"}) {
    EXPECT_TRUE(found.count(required)) << "models/" << required << ".json is missing";
  }
}

TEST(ModelZoo, EveryShippedFileCitesASource) {
  for (const auto& e : fs::directory_iterator(kSource / "models")) {
    if (e.path().extension() != ".json") continue;
    json j = read_json_file(e.path());
    ASSERT_TRUE(j.contains("source")) << e.path();
    EXPECT_GT(j["source"].get<std::string>().size(), 20u) << e.path();
  }
}

TEST(ModelZoo, Llama3_70bHasThePublishedShape) {
  // Llama 3 paper Table 3 and the HF config: 80 layers, 8192 hidden, 64 heads, 8 KV heads (GQA),
  // FFN 28672, vocabulary 128256, 8K context.
  const ModelSpec m = load_model("llama3-70b", kSource);
  EXPECT_EQ(m.layers, 80);
  EXPECT_EQ(m.hidden, 8192);
  EXPECT_EQ(m.heads, 64);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.head_dim(), 128);
  EXPECT_EQ(m.ffn_hidden, 28672);
  EXPECT_EQ(m.vocab, 128256);
  EXPECT_EQ(m.seq_len, 8192);
  EXPECT_EQ(m.activation, Activation::swiglu);
  EXPECT_EQ(m.norm, Norm::rmsnorm);
  EXPECT_EQ(m.position, Position::rope);
  EXPECT_FALSE(m.tied_embeddings);
}

TEST(ModelZoo, Gpt3_175bHasThePaperShape) {
  const ModelSpec m = load_model("gpt3-175b", kSource);
  EXPECT_EQ(m.layers, 96);
  EXPECT_EQ(m.hidden, 12288);
  EXPECT_EQ(m.heads, 96);
  EXPECT_EQ(m.kv_heads, 96);
  EXPECT_EQ(m.ffn_hidden, 4 * 12288);
  EXPECT_EQ(m.vocab, 50257);
  EXPECT_EQ(m.seq_len, 2048);
  EXPECT_EQ(m.activation, Activation::gelu);
  EXPECT_EQ(m.norm, Norm::layernorm);
  EXPECT_EQ(m.position, Position::learned);
  EXPECT_FALSE(m.tied_embeddings);
}

TEST(ModelZoo, TinyGptIsSmallEnoughForACpu) {
  const ModelSpec m = load_model("tiny-gpt", kSource);
  EXPECT_EQ(m.layers, 2);
  EXPECT_EQ(m.hidden, 64);
  EXPECT_EQ(m.heads, 4);
  EXPECT_TRUE(m.tied_embeddings);
  // 256·64 + 64·64 + 2·(49,920 + 512) + 128 = 120,576 parameters (see parameters()).
  EXPECT_EQ(parameters(m), 120576);
}

// Published parameter totals (Hugging Face safetensors metadata / model cards; GPT-3 paper Table
// 2.1 for 175B, which rounds): each shipped file's figures must reproduce them.
struct PublishedCount {
  const char* name;
  double params;
  double rel_tolerance;
};

class ModelZooParams : public ::testing::TestWithParam<PublishedCount> {};

TEST_P(ModelZooParams, MatchPublishedTotal) {
  const auto& p = GetParam();
  const ModelSpec m = load_model(p.name, kSource);
  EXPECT_NEAR(parameters(m), p.params, p.params * p.rel_tolerance) << p.name;
}

INSTANTIATE_TEST_SUITE_P(
    Published, ModelZooParams,
    ::testing::Values(PublishedCount{"gpt2", 124439808, 0}, PublishedCount{"gpt2-medium", 354823168, 0},
                      PublishedCount{"gpt2-large", 774030080, 0}, PublishedCount{"gpt2-xl", 1557611200, 0},
                      PublishedCount{"llama2-7b", 6738415616, 0}, PublishedCount{"llama2-13b", 13015864320, 0},
                      PublishedCount{"llama2-70b", 68976648192, 0}, PublishedCount{"llama3-8b", 8030261248, 0},
                      PublishedCount{"llama3-70b", 70553706496, 0},
                      PublishedCount{"llama3.1-405b", 405853388800, 0},
                      PublishedCount{"mistral-7b", 7241732096, 0},
                      // "175.0B" in the paper; the untied 50257x12288 head adds 0.6B.
                      PublishedCount{"gpt3-175b", 175.0e9, 0.005}),
    [](const auto& info) {
      std::string n = info.param.name;
      for (char& c : n)
        if (c == '-' || c == '.') c = '_';
      return n;
    });

// ---- the trainplan model format ---------------------------------------------------------------

json valid_model() {
  return json::parse(R"({"name": "m", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 256,
                         "vocab": 256, "seq_len": 64, "activation": "swiglu", "norm": "rmsnorm",
                         "tied_embeddings": false, "position": "alibi"})");
}

TEST(ParseModel, ReadsEveryField) {
  const ModelSpec m = parse_model(valid_model(), "m.json");
  EXPECT_EQ(m.name, "m");
  EXPECT_EQ(m.layers, 2);
  EXPECT_EQ(m.hidden, 64);
  EXPECT_EQ(m.heads, 4);
  EXPECT_EQ(m.kv_heads, 2);
  EXPECT_EQ(m.ffn_hidden, 256);
  EXPECT_EQ(m.vocab, 256);
  EXPECT_EQ(m.seq_len, 64);
  EXPECT_EQ(m.head_dim(), 16);
  EXPECT_EQ(m.activation, Activation::swiglu);
  EXPECT_EQ(m.norm, Norm::rmsnorm);
  EXPECT_EQ(m.position, Position::alibi);
  EXPECT_FALSE(m.tied_embeddings);
}

TEST(ParseModel, SourceIsOptional) {
  json j = valid_model();
  j["source"] = "a paper";
  EXPECT_NO_THROW(parse_model(j, "m.json"));
  j["source"] = 3;
  EXPECT_EQ(input_error([&] { parse_model(j, "m.json"); }), "m.json: source = 3, must be a string");
}

TEST(ParseModel, ToJsonRoundTrips) {
  const ModelSpec a = load_model("mistral-7b", kSource);
  const ModelSpec b = parse_model(to_json(a), "roundtrip");
  EXPECT_EQ(to_json(b), to_json(a));
  EXPECT_EQ(b.kv_heads, 8);
  EXPECT_EQ(b.position, Position::rope);
  EXPECT_EQ(to_json(a).size(), 12u);  // exactly the model keys, no "source"
}

TEST(ParseModel, EveryRequiredKeyIsRequired) {
  const json all = valid_model();  // named: items() of a temporary would dangle
  for (const auto& [key, value] : all.items()) {
    json j = valid_model();
    j.erase(key);
    EXPECT_EQ(input_error([&] { parse_model(j, "m.json"); }), "m.json: " + key + " is missing (required key)");
  }
}

TEST(ParseModel, IntegerFieldsRejectZero) {
  for (const char* key : {"layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len"}) {
    json j = valid_model();
    j[key] = 0;
    EXPECT_TRUE(StartsWith(input_error([&] { parse_model(j, "m.json"); }),
                           std::string("m.json: ") + key + " = 0, must be in [1, "));
  }
}

TEST(ParseModel, KvHeadsAboveHeadsIsRejected) {
  json j = valid_model();
  j["kv_heads"] = 8;  // 4 % 8 != 0
  EXPECT_EQ(input_error([&] { parse_model(j, "m.json"); }), "m.json: kv_heads = 8, must divide heads (4)");
}

// ---- bad model files: each names the file, the field and the rule ------------------------------

// One row per bad file in tests/data/bad: the loader's whole message after "<path>", or its start
// where the rest quotes the JSON parser.
struct BadFile {
  const char* name;
  const char* file;
  const char* message;
  bool prefix_only;
};

class BadModelFiles : public ::testing::TestWithParam<BadFile> {};

TEST_P(BadModelFiles, NamesTheFileTheFieldAndTheRule) {
  const BadFile& c = GetParam();
  const std::string got = input_error([&] { load_model(kBad + c.file, kSource); });
  const std::string want = kBad + c.file + c.message;
  if (c.prefix_only) {
    EXPECT_TRUE(got.starts_with(want)) << got;
  } else {
    EXPECT_EQ(got, want);
  }
}

const BadFile kBadFiles[] = {
    {"Malformed", "malformed.json", ": malformed JSON: ", true},
    {"Truncated", "truncated.json", ": malformed JSON: ", true},
    {"NotAnObject", "not_object.json", ": top level must be a JSON object", false},
    {"UnknownKey", "model_unknown_key.json", ": dropout_rate is not a known key", false},
    {"MissingKey", "model_missing_key.json", ": vocab is missing (required key)", false},
    {"WrongType", "model_wrong_type.json", ": layers = \"2\", must be an integer", false},
    {"OutOfRange", "model_out_of_range.json", ": layers = 0, must be in [1, 100000]", false},
    {"UnknownChoice", "model_bad_choice.json", ": activation = \"relu\", must be one of gelu|swiglu", false},
    {"HeadsNotDividingHidden", "model_heads_not_dividing.json", ": heads = 4, must divide hidden (66)", false},
    {"KvHeadsNotDividingHeads", "model_kv_heads_not_dividing.json", ": kv_heads = 3, must divide heads (4)", false},
    {"HfUnknownModelType", "hf_unknown_model_type.json", ": model_type = \"bert\", must be one of llama|mistral|qwen2|gpt2|gpt_neox|mixtral|qwen2_moe|qwen3_moe|deepseek_v3|kimi_k2|gpt_oss|llama4", false},
    {"HfMissingKey", "hf_missing_key.json", ": intermediate_size is missing (required key)", false},
    {"HfWrongType", "hf_wrong_type.json", ": n_layer = \"12\", must be an integer", false},
    {"HfHeadsNotDividingHidden", "hf_heads_not_dividing.json", ": num_attention_heads = 14, must divide hidden (900)", false},
};

INSTANTIATE_TEST_SUITE_P(
    Files, BadModelFiles, ::testing::ValuesIn(kBadFiles),
    [](const ::testing::TestParamInfo<BadFile>& info) { return std::string(info.param.name); });

TEST(BadModelFile, MissingFile) {
  const std::string path = kBad + "no-such-model.json";
  EXPECT_EQ(input_error([&] { load_model(path, kSource); }), path + ": cannot open file (No such file or directory)");
}

TEST(BadModelName, UnknownBuiltinNameSaysWhereItLooked) {
  EXPECT_EQ(input_error([] { load_model("llama9-1t", kSource); }),
            "--model llama9-1t: not a built-in model (see " + (kSource / "models").string() + ") and not a file");
}

// ---- Hugging Face config.json -----------------------------------------------------------------

TEST(HfConfig, Llama3_8b) {
  const ModelSpec m = load_model(kHf + "llama3-8b/config.json", kSource);
  EXPECT_EQ(m.name, "llama3-8b");  // the folder name
  EXPECT_EQ(m.layers, 32);
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.ffn_hidden, 14336);
  EXPECT_EQ(m.vocab, 128256);
  EXPECT_EQ(m.seq_len, 8192);
  EXPECT_EQ(m.activation, Activation::swiglu);
  EXPECT_EQ(m.norm, Norm::rmsnorm);
  EXPECT_EQ(m.position, Position::rope);
  EXPECT_FALSE(m.tied_embeddings);
  // Same architecture as the zoo's file.
  const ModelSpec zoo = load_model("llama3-8b", kSource);
  EXPECT_EQ(to_json(m), to_json(zoo));
}

TEST(HfConfig, Mistral7b) {
  const ModelSpec m = load_model(kHf + "mistral-7b/config.json", kSource);
  EXPECT_EQ(m.layers, 32);
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.ffn_hidden, 14336);
  EXPECT_EQ(m.vocab, 32000);
  // Not max_position_embeddings (32768, the longest sequence): trainplan's stated default.
  EXPECT_EQ(m.seq_len, 4096);
  EXPECT_EQ(m.activation, Activation::swiglu);
  EXPECT_EQ(parameters(m), 7241732096);
}

// Mistral-NeMo-12B (mistralai/Mistral-Nemo-Base-2407): head_dim 128 with 32 heads makes the
// attention 4096 wide for a hidden size of 5120. By hand, h = 5120, q = 32 x 128 = 4096,
// kv = 8 x 128 = 1024, f = 14336, V = 131072, 40 layers, untied, RMSNorm, no biases:
//   per layer  Q 5120 x 4096 = 20,971,520; K, V 2 x 5120 x 1024 = 10,485,760;
//              output 4096 x 5120 = 20,971,520; MLP 3 x 5120 x 14336 = 220,200,960;
//              two norms 10,240                                  -> 272,640,000
//   40 layers 10,905,600,000 + embedding and LM head 2 x 131072 x 5120 = 1,342,177,280
//   + final norm 5120 = 12,247,782,400 (12.25B; with head_dim ignored, q = 5120: 12.77B).
TEST(HfConfig, MistralNemoHeadDim) {
  const ModelSpec m = load_model(kHf + "mistral-nemo-12b/config.json", kSource);
  EXPECT_EQ(m.name, "mistral-nemo-12b");
  EXPECT_EQ(m.hidden, 5120);
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.head_dim(), 128);
  EXPECT_EQ(m.q_width(), 4096);
  EXPECT_EQ(m.kv_width(), 1024);
  EXPECT_EQ(parameters(m), 12247782400.0);
  EXPECT_EQ(to_json(m).at("head_dim"), 128);  // reports carry it
  // Without head_dim the same config is the hidden / heads = 160 wide model.
  json j = read_json_file(kHf + "mistral-nemo-12b/config.json");
  j.erase("head_dim");
  const ModelSpec wide = parse_hf_config(j, "x/config.json");
  EXPECT_EQ(wide.head_dim(), 160);
  EXPECT_FALSE(to_json(wide).contains("head_dim"));
  EXPECT_EQ(parameters(wide), 12772070400.0);
  j["head_dim"] = nullptr;  // as some configs write it: hidden / heads
  EXPECT_EQ(parse_hf_config(j, "x/config.json").head_dim(), 160);
}

TEST(ModelFile, HeadDimIsOptionalAndRoundTrips) {
  json j = to_json(load_model("llama3-8b", kSource));
  EXPECT_FALSE(j.contains("head_dim"));
  j["head_dim"] = 64;  // narrower attention: 32 x 64 = 2048 for hidden 4096
  const ModelSpec m = parse_model(j, "m.json");
  EXPECT_EQ(m.head_dim(), 64);
  EXPECT_EQ(m.q_width(), 2048);
  EXPECT_EQ(m.kv_width(), 512);
  EXPECT_EQ(to_json(m), j);
  // An explicit head_dim frees hidden from being a multiple of heads.
  j["hidden"] = 4100;
  EXPECT_EQ(parse_model(j, "m.json").q_width(), 2048);
  j.erase("head_dim");
  EXPECT_EQ(input_error([&] { parse_model(j, "m.json"); }), "m.json: heads = 32, must divide hidden (4100)");
}

TEST(BadModelFile, HeadDim) {
  auto msg = [](const char* file) { return input_error([&] { load_model(kBad + file, kSource); }); };
  EXPECT_EQ(msg("model_head_dim_zero.json"), kBad + "model_head_dim_zero.json: head_dim = 0, must be in [1, 65536]");
  EXPECT_EQ(msg("model_head_dim_negative.json"),
            kBad + "model_head_dim_negative.json: head_dim = -16, must be in [1, 65536]");
  EXPECT_EQ(msg("model_head_dim_fraction.json"),
            kBad + "model_head_dim_fraction.json: head_dim = 16.5, must be an integer");
  EXPECT_EQ(msg("model_head_dim_odd_rope.json"),
            kBad + "model_head_dim_odd_rope.json: head_dim = 15, must be even with RoPE (it rotates pairs of channels)");
  EXPECT_EQ(msg("model_odd_head_size_rope.json"),
            kBad + "model_odd_head_size_rope.json: heads = 20, gives an odd head size hidden / heads = 60 / 20 = 3, "
                   "which RoPE cannot rotate (it rotates pairs of channels)");
  EXPECT_EQ(msg("hf_head_dim_odd_rope.json"),
            kBad + "hf_head_dim_odd_rope.json: head_dim = 127, must be even with RoPE (it rotates pairs of channels)");
  EXPECT_EQ(msg("hf_head_dim_zero.json"), kBad + "hf_head_dim_zero.json: head_dim = 0, must be in [1, 65536]");
  // An odd head size is fine without RoPE (learned positions).
  json j = read_json_file(kBad + "model_head_dim_odd_rope.json");
  j["position"] = "learned";
  EXPECT_EQ(parse_model(j, "m.json").head_dim(), 15);
}

TEST(HfConfig, Qwen2TiesEmbeddingsWhenTheConfigSaysSo) {
  const ModelSpec m = load_model(kHf + "qwen2-0.5b/config.json", kSource);
  EXPECT_EQ(m.name, "qwen2-0.5b");
  EXPECT_EQ(m.layers, 24);
  EXPECT_EQ(m.hidden, 896);
  EXPECT_EQ(m.heads, 14);
  EXPECT_EQ(m.kv_heads, 2);
  EXPECT_EQ(m.head_dim(), 64);
  EXPECT_EQ(m.ffn_hidden, 4864);
  EXPECT_EQ(m.vocab, 151936);
  EXPECT_EQ(m.seq_len, 4096);  // not max_position_embeddings 131072
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_EQ(m.norm, Norm::rmsnorm);
}

// Dropout is a property of the training recipe: optional, 0 when absent; a Hugging Face config
// gives it as attention/hidden/residual/embedding dropout probabilities (the largest is taken).
TEST(ModelFile, DropoutIsOptionalAndRoundTrips) {
  json j = to_json(load_model("llama3-8b", kSource));
  EXPECT_FALSE(j.contains("dropout"));
  EXPECT_EQ(parse_model(j, "m.json").dropout, 0);
  EXPECT_EQ(load_model("gpt3-175b", kSource).dropout, 0.1);
  j["dropout"] = 0.1;
  EXPECT_EQ(to_json(parse_model(j, "m.json")), j);
  j["dropout"] = 1;
  EXPECT_EQ(input_error([&] { parse_model(j, "m.json"); }),
            "m.json: dropout = 1, must be below 1 (a probability of dropping an element)");
  j["dropout"] = -0.1;
  EXPECT_NE(input_error([&] { parse_model(j, "m.json"); }).find("m.json: dropout"), std::string::npos);
  EXPECT_EQ(load_model(kHf + "llama3-8b/config.json", kSource).dropout, 0);  // "attention_dropout": 0.0
  EXPECT_EQ(load_model(kHf + "gpt2/config.json", kSource).dropout, 0.1);     // resid/embd/attn_pdrop 0.1
}

// The dense linears' biases: Qwen2's Q, K and V projections always carry them (Qwen2Attention),
// Llama's follow attention_bias (Q, K, V and O) and mlp_bias (gate, up and down); each bias adds
// its output width of parameters. A model file states them only where they differ from the
// norm's convention, and reads them back.
TEST(HfConfig, LinearBiasesAsTheFamilyHasThem) {
  const ModelSpec qwen = load_model(kHf + "qwen2-0.5b/config.json", kSource);
  EXPECT_EQ(qwen.linear_biases(), (LinearBiases{true, false, false}));
  ModelSpec unbiased = qwen;
  unbiased.biases.reset();
  const double per_layer = static_cast<double>(qwen.q_width() + 2 * qwen.kv_width());  // 896 + 2 x 128
  EXPECT_DOUBLE_EQ(LayerGraph(qwen, 4096).total_params() - LayerGraph(unbiased, 4096).total_params(), 24 * per_layer);
  // Qwen2-0.5B's published total, 494,032,768 (tied embeddings), needs them.
  EXPECT_DOUBLE_EQ(LayerGraph(qwen, 4096).total_params(), 494032768.0);

  json j = read_json_file(kHf + "llama3-8b/config.json");
  const ModelSpec plain = parse_hf_config(j, "llama.json");
  EXPECT_FALSE(plain.biases.has_value()) << "no biases, as RMSNorm implies: nothing to state";
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  const ModelSpec biased = parse_hf_config(j, "llama.json");
  EXPECT_EQ(biased.linear_biases(), (LinearBiases{true, true, true}));
  const double h = 4096, kv = 1024, f = 14336;
  EXPECT_DOUBLE_EQ(LayerGraph(biased, 8192).total_params() - LayerGraph(plain, 8192).total_params(),
                   32 * ((h + 2 * kv) + h + 2 * f + h));  // QKV, O, gate and up, down

  // Round trip through a model file; a statement equal to the norm's convention is not kept.
  EXPECT_EQ(to_json(parse_model(to_json(biased), "m.json")), to_json(biased));
  EXPECT_EQ(parse_model(to_json(biased), "m.json").linear_biases(), (LinearBiases{true, true, true}));
  json file = to_json(plain);
  file["biases"] = {{"qkv", false}, {"out", false}, {"mlp", false}};
  EXPECT_FALSE(parse_model(file, "m.json").biases.has_value());
  file["biases"] = {{"qkv", true}, {"out", false}};
  EXPECT_THROW(parse_model(file, "m.json"), InputError) << "all three are required";
}

TEST(HfConfig, Gpt2NullInnerMeansFourTimesHidden) {
  const ModelSpec m = load_model(kHf + "gpt2/config.json", kSource);
  EXPECT_EQ(m.layers, 12);
  EXPECT_EQ(m.hidden, 768);
  EXPECT_EQ(m.heads, 12);
  EXPECT_EQ(m.kv_heads, 12);
  EXPECT_EQ(m.ffn_hidden, 3072);  // "n_inner": null
  EXPECT_EQ(m.vocab, 50257);
  EXPECT_EQ(m.seq_len, 1024);
  EXPECT_EQ(m.activation, Activation::gelu);
  EXPECT_EQ(m.norm, Norm::layernorm);
  EXPECT_EQ(m.position, Position::learned);
  EXPECT_TRUE(m.tied_embeddings);
  const ModelSpec zoo = load_model("gpt2", kSource);
  EXPECT_EQ(to_json(m), to_json(zoo));
}

// GPT2LMHeadModel ties its LM head unless the config says tie_word_embeddings false; the key was
// ignored and every gpt2 config loaded tied.
TEST(HfConfig, Gpt2TiesUnlessTheConfigSaysNot) {
  json j = read_json_file(kHf + "gpt2/config.json");
  EXPECT_TRUE(parse_hf_config(j, "g.json").tied_embeddings);
  j["tie_word_embeddings"] = false;
  EXPECT_FALSE(parse_hf_config(j, "g.json").tied_embeddings);
}

// GPT2Config reads hidden_size, num_hidden_layers, num_attention_heads and max_position_embeddings
// as n_embd, n_layer, n_head and n_positions: a config with the common names loads, and one whose
// two names disagree is refused (hidden_size 4096 beside n_embd 768 loaded as 124M).
TEST(HfConfig, Gpt2ReadsTheCommonNamesToo) {
  json j = read_json_file(kHf + "gpt2/config.json");
  for (const char* k : {"n_embd", "n_layer", "n_head", "n_positions"}) j.erase(k);
  j["hidden_size"] = 1024;
  j["num_hidden_layers"] = 24;
  j["num_attention_heads"] = 16;
  j["max_position_embeddings"] = 1024;
  const ModelSpec m = parse_hf_config(j, "g.json");
  EXPECT_EQ(m.hidden, 1024);
  EXPECT_EQ(m.layers, 24);
  EXPECT_EQ(m.heads, 16);
  j["n_embd"] = 768;
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(j, "g.json"); }), "g.json: hidden_size = 1024, must equal n_embd (768)"));
  // GPT-2 and GPT-NeoX have no head_dim or num_key_value_heads: one that changes the shape is refused.
  json n = read_json_file(kHf + "pythia-160m/config.json");
  n["head_dim"] = 64;  // hidden / heads: the same shape
  EXPECT_EQ(parse_hf_config(n, "n.json").head_dim(), 64);
  n["head_dim"] = 128;
  EXPECT_TRUE(Contains(input_error([&] { parse_hf_config(n, "n.json"); }), "n.json: head_dim = 128, is not a key of a gpt_neox config"));
}

TEST(HfConfig, Gpt2ExplicitInner) {
  json j = read_json_file(kHf + "gpt2/config.json");
  j["n_inner"] = 1000;
  EXPECT_EQ(parse_hf_config(j, "cfg/config.json").ffn_hidden, 1000);
}

TEST(HfConfig, GptNeoxPythia) {
  const ModelSpec m = load_model(kHf + "pythia-160m/config.json", kSource);
  EXPECT_EQ(m.name, "pythia-160m");
  EXPECT_EQ(m.layers, 12);
  EXPECT_EQ(m.hidden, 768);
  EXPECT_EQ(m.heads, 12);
  EXPECT_EQ(m.kv_heads, 12);
  EXPECT_EQ(m.ffn_hidden, 3072);
  EXPECT_EQ(m.vocab, 50304);
  EXPECT_EQ(m.seq_len, 2048);
  EXPECT_EQ(m.activation, Activation::gelu);
  EXPECT_EQ(m.norm, Norm::layernorm);
  EXPECT_EQ(m.position, Position::rope);
  EXPECT_FALSE(m.tied_embeddings);
}

TEST(HfConfig, MissingKvHeadsMeansMultiHeadAttention) {
  json j = read_json_file(kHf + "llama3-8b/config.json");
  j.erase("num_key_value_heads");
  EXPECT_EQ(parse_hf_config(j, "x/config.json").kv_heads, 32);
}

// A config states no training length; its position limit (max_position_embeddings, n_positions)
// is the longest sequence the positions allow, often far past the trained one. The rule
// (set_hf_training_seq_len): 8192 for the Llama 3 family (llama with vocab_size 128256), 4096
// otherwise, never above the position limit. Each figure is the rule applied by hand.
TEST(HfConfig, TrainingLengthIsStatedNeverThePositionLimit) {
  const json llama3 = read_json_file(kHf + "llama3-8b/config.json");
  auto seq = [](json j, const char* key, int value) {
    j[key] = value;
    return parse_hf_config(j, "m/config.json").seq_len;
  };
  EXPECT_EQ(seq(llama3, "max_position_embeddings", 8192), 8192);     // Llama 3 8B
  EXPECT_EQ(seq(llama3, "max_position_embeddings", 131072), 8192);   // Llama 3.1: 128K limit, 8K training
  EXPECT_EQ(seq(llama3, "max_position_embeddings", 2048), 2048);     // below 8192: the limit
  EXPECT_EQ(seq(llama3, "vocab_size", 32000), 4096);                 // Llama 2's tokenizer: not Llama 3
  json llama1 = llama3;
  llama1["vocab_size"] = 32000;
  EXPECT_EQ(seq(llama1, "max_position_embeddings", 2048), 2048);     // Llama 1, TinyLlama: 2048 positions
  json mistral = read_json_file(kHf + "mistral-7b/config.json");
  mistral["vocab_size"] = 128256;                                    // the Llama 3 vocabulary alone is not
  EXPECT_EQ(parse_hf_config(mistral, "m/config.json").seq_len, 4096);  // the Llama 3 family: llama type too
  EXPECT_EQ(load_model(kHf + "mistral-nemo-12b/config.json", kSource).seq_len, 4096);  // 1024000 positions
  EXPECT_EQ(load_model(kHf + "gpt2/config.json", kSource).seq_len, 1024);              // n_positions 1024
  EXPECT_EQ(load_model(kHf + "pythia-160m/config.json", kSource).seq_len, 2048);       // 2048 positions
  // The source is stated for every config (commands print it) and for no trainplan model file.
  auto source = [](const char* dir) { return load_model(kHf + dir + "/config.json", kSource).seq_len_source; };
  EXPECT_TRUE(StartsWith(source("llama3-8b"), "the Llama 3 family's pre-training length"));
  EXPECT_TRUE(StartsWith(source("mistral-7b"), "trainplan's default for a config that states no training length"));
  EXPECT_TRUE(StartsWith(source("gpt2"), "the config's n_positions, the longest sequence its positions allow (below the 4096"));
  EXPECT_EQ(load_model("llama3-8b", kSource).seq_len_source, "");
}

// --model DIR: a folder as Hugging Face lays a model out is read through its config.json, named
// after the folder.
TEST(HfConfig, FolderMeansItsConfigJson) {
  for (const std::string& dir : {kHf + "llama3-8b", kHf + "llama3-8b/"}) {
    const ModelSpec m = load_model(dir, kSource);
    EXPECT_EQ(m.name, "llama3-8b") << dir;
    EXPECT_EQ(to_json(m), to_json(load_model(kHf + "llama3-8b/config.json", kSource))) << dir;
  }
  EXPECT_EQ(input_error([] { load_model(kData + "/hf", kSource); }),
            "--model " + kData + "/hf: is a directory without a config.json (a Hugging Face model folder "
            "holds one; or name a model file)");
  // "." is named by the folder it stands for (--model . inside a model folder).
  const json j = read_json_file(kHf + "gpt2/config.json");
  EXPECT_EQ(parse_hf_config(j, "./config.json").name, fs::current_path().filename().string());
  EXPECT_EQ(parse_hf_config(j, "a/b/../config.json").name, "a");
}

TEST(HfConfig, NameOrPathWinsOverTheFolder) {
  json j = read_json_file(kHf + "llama3-8b/config.json");
  j["_name_or_path"] = "meta-llama/Meta-Llama-3-8B";
  EXPECT_EQ(parse_hf_config(j, "x/config.json").name, "meta-llama/Meta-Llama-3-8B");
}

TEST(HfConfig, NameFallsBackToFolderThenFileStem) {
  json j = read_json_file(kHf + "llama3-8b/config.json");
  EXPECT_EQ(parse_hf_config(j, "models/my-llama/config.json").name, "my-llama");
  EXPECT_EQ(parse_hf_config(j, "models/my-llama.json").name, "my-llama");
  EXPECT_EQ(parse_hf_config(j, "config.json").name, "llama");  // nothing better: the model_type
  j["_name_or_path"] = "";  // save_pretrained writes this for models built in memory
  EXPECT_EQ(parse_hf_config(j, "models/my-llama/config.json").name, "my-llama");
  j["_name_or_path"] = 7;
  EXPECT_EQ(input_error([&] { parse_hf_config(j, "c.json"); }), "c.json: _name_or_path = 7, must be a string");
}

TEST(BadHfConfig, KvHeadsNotDividingHeads) {
  json j = read_json_file(kHf + "llama3-8b/config.json");
  j["num_key_value_heads"] = 5;
  EXPECT_EQ(input_error([&] { parse_hf_config(j, "x/config.json"); }),
            "x/config.json: num_key_value_heads = 5, must divide heads (32)");
}

}  // namespace
}  // namespace trainplan

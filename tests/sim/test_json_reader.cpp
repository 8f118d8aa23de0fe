// Unit tests for sim/json_reader: strict reading of JSON objects, and the exact wording of the
// errors (file, field path, value, rule) that the CLI prints as its one-line message.
#include "sim/json_reader.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include "sim/software.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

using testing::Contains;
using testing::input_error;
using testing::StartsWith;

using nlohmann::json;

const std::string kBad = std::string(TRAINPLAN_TEST_DATA_DIR) + "/bad/";

// ---- read_json_file -------------------------------------------------------------------------

TEST(ReadJsonFile, ReadsAShippedFile) {
  json j = read_json_file(std::string(TRAINPLAN_SOURCE_DIR) + "/topologies/dgx-a100-80g.json");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("name"), "dgx-a100-80g");
  EXPECT_EQ(j.at("node").at("gpus"), 8);
}

TEST(ReadJsonFile, MissingFileNamesTheFile) {
  const std::string path = kBad + "does-not-exist.json";
  EXPECT_EQ(input_error([&] { read_json_file(path); }),
            path + ": cannot open file (No such file or directory)");
}

TEST(ReadJsonFile, MalformedJsonNamesFileAndPosition) {
  // The stray second comma sits on line 3, column 16.
  const std::string msg = input_error([&] { read_json_file(kBad + "malformed.json"); });
  EXPECT_TRUE(StartsWith(msg, kBad + "malformed.json: malformed JSON: "));
  EXPECT_TRUE(Contains(msg, "line 3, column 16"));
  EXPECT_FALSE(Contains(msg, "[json.exception"));  // nlohmann's prefix is stripped
}

TEST(ReadJsonFile, TruncatedJsonSaysEndOfInput) {
  const std::string msg = input_error([&] { read_json_file(kBad + "truncated.json"); });
  EXPECT_TRUE(StartsWith(msg, kBad + "truncated.json: malformed JSON: "));
  EXPECT_TRUE(Contains(msg, "unexpected end of input"));
}

TEST(ReadJsonFile, EmptyFileIsMalformed) {
  const std::string msg = input_error([&] { read_json_file(kBad + "empty.json"); });
  EXPECT_TRUE(StartsWith(msg, kBad + "empty.json: malformed JSON: "));
}

TEST(ReadJsonFile, DuplicateKeyIsRejectedNotSilentlyOverwritten) {
  // nlohmann alone would keep "layers": 32 and drop 2 without a word.
  EXPECT_EQ(input_error([&] { read_json_file(kBad + "duplicate_key.json"); }),
            kBad + "duplicate_key.json: key \"layers\" appears twice in the same object");
}

TEST(ReadJsonFile, EqualKeysInDifferentObjectsAreFine) {
  const std::string path = ::testing::TempDir() + "/trainplan_same_keys.json";
  {
    std::ofstream out(path);
    out << R"({"x": {"x": 1}, "b": {"x": 2, "y": {"x": 3}}, "c": [{"x": 1}, {"x": 2}], "y": 0})";
  }
  json j = read_json_file(path);
  EXPECT_EQ(j["b"]["y"]["x"], 3);
  EXPECT_EQ(j["c"][1]["x"], 2);
  std::remove(path.c_str());
}

// A value nested 200,000 deep in a field used to crash (stack overflow) when its error message
// printed it; nesting is refused while parsing, at kMaxJsonDepth levels.
TEST(ReadJsonFile, NestingDeeperThanTheLimitIsRefused) {
  const auto nested = [](int levels) {
    return R"({"layers": )" + std::string(levels, '[') + std::string(levels, ']') + "}";
  };
  EXPECT_EQ(parse_json_text(nested(kMaxJsonDepth - 1), "m.json")["layers"].size(), 1u);
  const std::string why = "m.json: values nested more than 64 levels deep (no trainplan file nests so deep)";
  EXPECT_EQ(input_error([&] { parse_json_text(nested(kMaxJsonDepth), "m.json"); }), why);
  EXPECT_EQ(input_error([&] { parse_json_text(nested(200000), "m.json"); }), why);
}

// An array of many objects parses in linear time (nlohmann's callback parser, used before, scanned
// the array again after each object it closed: 64 MB of {} ran for hours), and the number of
// objects, arrays and strings is bounded (64 MB of "" ended in std::terminate under 2 GiB).
TEST(ReadJsonFile, ManyValuesAreLinearAndBounded) {
  const auto array_of = [](const std::string& item, long long n) {
    std::string text = "[";
    for (long long i = 0; i < n; ++i) text += (i ? "," : "") + item;
    return text + "]";
  };
  EXPECT_EQ(parse_json_text(array_of("{}", 300000), "m.json").size(), 300000u);
  const std::string why = "m.json: more than 4194304 objects, arrays and strings (no trainplan file holds so many)";
  EXPECT_EQ(input_error([&] { parse_json_text(array_of("{}", kMaxJsonAllocations), "m.json"); }), why);
  EXPECT_EQ(input_error([&] { parse_json_text(array_of("\"\"", kMaxJsonAllocations), "m.json"); }), why);
  EXPECT_EQ(parse_json_text(array_of("0", kMaxJsonAllocations + 1), "m.json").size(), std::size_t(kMaxJsonAllocations + 1));
}

TEST(ReadJsonFile, DirectoryIsNotAFile) {
  const std::string dir = std::string(TRAINPLAN_TEST_DATA_DIR) + "/bad";
  EXPECT_EQ(input_error([&] { read_json_file(dir); }), dir + ": cannot open file (is a directory)");
}

// ---- JsonObject: construction and key bookkeeping -------------------------------------------

TEST(JsonObject, RejectsANonObjectAtTopLevel) {
  json j = read_json_file(kBad + "not_object.json");
  EXPECT_EQ(input_error([&] { JsonObject o(j, "f.json"); }), "f.json: top level must be a JSON object");
}

TEST(JsonObject, MissingKeyNamesTheFullPath) {
  json j = {{"gpu", {{"name", "x"}}}};
  JsonObject o(j, "f.json");
  JsonObject g = o.object("gpu");
  EXPECT_EQ(input_error([&] { g.number("hbm_gb", 0, 1e6); }), "f.json: gpu.hbm_gb is missing (required key)");
}

TEST(JsonObject, FinishRejectsKeysNoAccessorAskedFor) {
  json j = {{"a", 1}, {"b", 2}};
  JsonObject o(j, "f.json");
  o.integer("a", 0, 10);
  EXPECT_EQ(input_error([&] { o.finish(); }), "f.json: b is not a known key");
  o.integer("b", 0, 10);
  EXPECT_NO_THROW(o.finish());
}

TEST(JsonObject, FinishNamesNestedUnknownKeys) {
  json j = {{"node", {{"gpus", 8}, {"gpu_count", 8}}}};
  JsonObject o(j, "f.json");
  JsonObject n = o.object("node");
  n.integer("gpus", 1, 16);
  EXPECT_EQ(input_error([&] { n.finish(); }), "f.json: node.gpu_count is not a known key");
}

// null is a value: has() sees the key (and the accessor then refuses null); has_value(), for
// formats whose null means "not set", does not. Both mark the key read.
TEST(JsonObject, HasCountsNullAsGivenHasValueAsAbsent) {
  json j = {{"n_inner", nullptr}, {"x", 3}, {"head_dim", nullptr}};
  JsonObject o(j, "f.json");
  EXPECT_TRUE(o.has("n_inner"));
  EXPECT_FALSE(o.has_value("head_dim"));
  EXPECT_TRUE(o.has("x"));
  EXPECT_TRUE(o.has_value("x"));
  EXPECT_FALSE(o.has("y"));
  EXPECT_FALSE(o.has_value("y"));
  EXPECT_NO_THROW(o.finish());
}

// Each typed accessor refuses null in the words of its type, "..., not null".
TEST(JsonObject, EveryAccessorRefusesNullNamingIt) {
  json j = {{"n", nullptr}};
  JsonObject o(j, "f.json");
  EXPECT_EQ(input_error([&] { o.integer("n", 1, 8); }), "f.json: n = null, must be an integer, not null");
  EXPECT_EQ(input_error([&] { o.string("n"); }), "f.json: n = null, must be a string, not null");
  EXPECT_EQ(input_error([&] { o.optional_string("n"); }), "f.json: n = null, must be a string, not null");
  EXPECT_EQ(input_error([&] { o.choice("n", {"a", "b"}); }), "f.json: n = null, must be one of a|b, not null");
  EXPECT_EQ(input_error([&] { o.boolean("n"); }), "f.json: n = null, must be true or false, not null");
  EXPECT_EQ(input_error([&] { o.object("n"); }), "f.json: n = null, must be a JSON object, not null");
  EXPECT_EQ(input_error([&] { o.objects("n"); }), "f.json: n = null, must be an array of objects, not null");
}

// ---- numbers ---------------------------------------------------------------------------------

TEST(JsonObject, NumberAcceptsTheClosedBounds) {
  json j = {{"lo", 0}, {"hi", 1}, {"mid", 0.25}};
  JsonObject o(j, "f.json");
  EXPECT_DOUBLE_EQ(o.number("lo", 0, 1), 0.0);
  EXPECT_DOUBLE_EQ(o.number("hi", 0, 1), 1.0);
  EXPECT_DOUBLE_EQ(o.number("mid", 0, 1, true), 0.25);
}

TEST(JsonObject, NumberOutOfRangeGivesValueAndInterval) {
  json j = {{"network", json::array({{{"efficiency", 0.8}}, {{"efficiency", 1.3}}})}};
  JsonObject o(j, "topologies/dgx-h100.json");
  auto tiers = o.objects("network");
  ASSERT_EQ(tiers.size(), 2u);
  EXPECT_DOUBLE_EQ(tiers[0].number("efficiency", 0, 1, true), 0.8);
  // The example of DESIGN.md convention 1, verbatim.
  EXPECT_EQ(input_error([&] { tiers[1].number("efficiency", 0, 1, true); }),
            "topologies/dgx-h100.json: network[1].efficiency = 1.3, must be in (0, 1]");
}

TEST(JsonObject, NumberOpenLowerBoundRejectsTheBound) {
  json j = {{"efficiency", 0}};
  JsonObject o(j, "f.json");
  EXPECT_EQ(input_error([&] { o.number("efficiency", 0, 1, true); }), "f.json: efficiency = 0, must be in (0, 1]");
  EXPECT_DOUBLE_EQ(o.number("efficiency", 0, 1, false), 0.0);
}

// An infinite bound reads as kMaxJsonMagnitude (1e100): 1.7e308 seconds in a prediction would
// pass "[0, inf]" and overflow the report's sums and chart scales.
TEST(JsonObject, NumberBelowClosedRangeAndInfiniteUpperBound) {
  json j = {{"latency_us", -1}, {"step_s", 1.7e308}, {"loss", -1e300}};
  JsonObject o(j, "f.json");
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(input_error([&] { o.number("latency_us", 0, 1e6); }), "f.json: latency_us = -1, must be in [0, 1e+06]");
  EXPECT_EQ(input_error([&] { o.number("latency_us", 0, inf); }), "f.json: latency_us = -1, must be in [0, 1e+100]");
  EXPECT_EQ(input_error([&] { o.number("step_s", 0, inf); }), "f.json: step_s = 1.7e+308, must be in [0, 1e+100]");
  EXPECT_EQ(input_error([&] { o.number("loss", -inf, inf); }), "f.json: loss = -1e+300, must be in [-1e+100, 1e+100]");
}

TEST(JsonObject, NumberOfWrongTypeSaysSo) {
  json j = {{"bw", "25"}, {"flag", true}, {"n", nullptr}};
  JsonObject o(j, "f.json");
  EXPECT_EQ(input_error([&] { o.number("bw", 0, 1e6); }), "f.json: bw = \"25\", must be a number");
  EXPECT_EQ(input_error([&] { o.number("flag", 0, 1e6); }), "f.json: flag = true, must be a number");
  EXPECT_EQ(input_error([&] { o.number("n", 0, 1e6); }), "f.json: n = null, must be a number, not null");
}

TEST(JsonObject, OptionalNumberIsAbsentOrChecked) {
  json j = {{"a", 2.5}, {"b", nullptr}, {"c", 7}};
  JsonObject o(j, "f.json");
  EXPECT_EQ(o.optional_number("a", 0, 5), 2.5);
  // Absent is absent; null is a value of the wrong type.
  EXPECT_EQ(input_error([&] { o.optional_number("b", 0, 5); }), "f.json: b = null, must be a number, not null");
  EXPECT_EQ(o.optional_number("missing", 0, 5), std::nullopt);
  EXPECT_EQ(input_error([&] { o.optional_number("c", 0, 5); }), "f.json: c = 7, must be in [0, 5]");
}

// ---- integers --------------------------------------------------------------------------------

TEST(JsonObject, IntegerRangeIsInclusive) {
  json j = {{"a", 1}, {"b", 100}, {"c", 101}, {"d", 0}};
  JsonObject o(j, "f.json");
  EXPECT_EQ(o.integer("a", 1, 100), 1);
  EXPECT_EQ(o.integer("b", 1, 100), 100);
  EXPECT_EQ(input_error([&] { o.integer("c", 1, 100); }), "f.json: c = 101, must be in [1, 100]");
  EXPECT_EQ(input_error([&] { o.integer("d", 1, 100); }), "f.json: d = 0, must be in [1, 100]");
}

TEST(JsonObject, IntegerRejectsFractionsFloatsAndStrings) {
  json j = {{"a", 2.5}, {"b", 2.0}, {"c", "2"}};
  JsonObject o(j, "f.json");
  EXPECT_EQ(input_error([&] { o.integer("a", 1, 100); }), "f.json: a = 2.5, must be an integer");
  EXPECT_EQ(input_error([&] { o.integer("b", 1, 100); }), "f.json: b = 2.0, must be an integer, written without a decimal point or exponent");
  EXPECT_EQ(input_error([&] { o.integer("c", 1, 100); }), "f.json: c = \"2\", must be an integer");
}

TEST(JsonObject, IntegerTooLargeForLongLongIsOutOfRange) {
  json j = json::parse(R"({"layers": 18446744073709551615})");
  JsonObject o(j, "f.json");
  EXPECT_EQ(input_error([&] { o.integer("layers", 1, 100000); }),
            "f.json: layers = 18446744073709551615, must be in [1, 100000]");
}

// ---- strings, choices, booleans --------------------------------------------------------------

TEST(JsonObject, StringMustBeANonEmptyString) {
  json j = {{"name", "gpt2"}, {"empty", ""}, {"num", 3}};
  JsonObject o(j, "f.json");
  EXPECT_EQ(o.string("name"), "gpt2");
  EXPECT_EQ(input_error([&] { o.string("empty"); }), "f.json: empty = \"\", must not be empty");
  EXPECT_EQ(input_error([&] { o.string("num"); }), "f.json: num = 3, must be a string");
  EXPECT_EQ(o.optional_string("absent"), std::nullopt);
  EXPECT_EQ(o.optional_string("name"), "gpt2");
}

TEST(JsonObject, ChoiceListsTheAllowedValues) {
  json j = {{"norm", "rmsnorm"}, {"act", "relu"}, {"pos", 1}};
  JsonObject o(j, "f.json");
  EXPECT_EQ(o.choice("norm", {"layernorm", "rmsnorm"}), "rmsnorm");
  EXPECT_EQ(input_error([&] { o.choice("act", {"gelu", "swiglu"}); }),
            "f.json: act = \"relu\", must be one of gelu|swiglu");
  EXPECT_EQ(input_error([&] { o.choice("pos", {"learned", "rope", "alibi"}); }),
            "f.json: pos = 1, must be one of learned|rope|alibi");
}

TEST(JsonObject, ChoiceIsCaseSensitive) {
  json j = {{"norm", "RMSNorm"}};
  JsonObject o(j, "f.json");
  EXPECT_EQ(input_error([&] { o.choice("norm", {"layernorm", "rmsnorm"}); }),
            "f.json: norm = \"RMSNorm\", must be one of layernorm|rmsnorm");
}

TEST(JsonObject, BooleanRejectsNumbersAndStrings) {
  json j = {{"t", true}, {"one", 1}, {"s", "true"}};
  JsonObject o(j, "f.json");
  EXPECT_TRUE(o.boolean("t"));
  EXPECT_EQ(input_error([&] { o.boolean("one"); }), "f.json: one = 1, must be true or false");
  EXPECT_EQ(input_error([&] { o.boolean("s"); }), "f.json: s = \"true\", must be true or false");
}

// ---- objects and arrays ----------------------------------------------------------------------

TEST(JsonObject, ObjectOfWrongTypeSaysSo) {
  json j = {{"gpu", json::array()}};
  JsonObject o(j, "f.json");
  EXPECT_EQ(input_error([&] { o.object("gpu"); }), "f.json: gpu = [], must be a JSON object");
}

TEST(JsonObject, ObjectsChecksArrayTypeCountAndElements) {
  json j = {{"tiers", {{"name", "ib"}}},
            {"few", json::array()},
            {"mixed", json::array({json::object(), 3})}};
  JsonObject o(j, "f.json");
  EXPECT_EQ(input_error([&] { o.objects("tiers"); }), "f.json: tiers = {\"name\":\"ib\"}, must be an array of objects");
  EXPECT_EQ(input_error([&] { o.objects("few", 1); }), "f.json: few = [], must hold at least 1 entries");
  EXPECT_EQ(o.objects("few").size(), 0u);
  EXPECT_EQ(input_error([&] { o.objects("mixed"); }), "f.json: mixed[1] must be a JSON object");
}

TEST(JsonObject, ElementsOfNestedArraysCarryTheirIndexInThePath) {
  json j = {{"gpu", {{"curve", json::array({{{"flops", 1}}, {{"flops", 2}, {"extra", 0}}})}}}};
  JsonObject o(j, "f.json");
  auto points = o.object("gpu").objects("curve");
  ASSERT_EQ(points.size(), 2u);
  points[1].number("flops", 0, 10);
  EXPECT_EQ(input_error([&] { points[1].finish(); }), "f.json: gpu.curve[1].extra is not a known key");
  EXPECT_EQ(input_error([&] { points[0].number("efficiency", 0, 1); }),
            "f.json: gpu.curve[0].efficiency is missing (required key)");
  EXPECT_EQ(points[1].field("flops"), "gpu.curve[1].flops");
}

TEST(JsonObject, ErrorOnAKeyWithoutValueOmitsTheValue) {
  json j = {{"heads", 12}};
  JsonObject o(j, "m.json");
  EXPECT_EQ(std::string(o.error("heads", "must divide hidden (1000)").what()),
            "m.json: heads = 12, must divide hidden (1000)");
  EXPECT_EQ(std::string(o.error("kv_heads", "is required for GQA").what()), "m.json: kv_heads is required for GQA");
}

// ---- null is not absent, loader by loader ----------------------------------------------------
// Each loader that reads optional keys with has(): a key given as null is refused in one message
// naming the file and the field, not read as if it were left out. Hugging Face configs are the
// exception their format makes: transformers writes an unset optional key as null.

const std::string kSource = TRAINPLAN_SOURCE_DIR;

json source_file(const std::string& relative) { return read_json_file(kSource + "/" + relative); }

TEST(NullIsNotAbsent, ModelFileOptionalKeys) {
  for (const auto& [key, rule] : {std::pair{"dropout", "must be a number, not null"},
                                  std::pair{"head_dim", "must be an integer, not null"},
                                  std::pair{"source", "must be a string, not null"}}) {
    json j = source_file("models/gpt2.json");
    j[key] = nullptr;
    EXPECT_EQ(input_error([&] { parse_model(j, "m.json"); }), fmt::format("m.json: {} = null, {}", key, rule));
  }
}

TEST(NullIsNotAbsent, HuggingFaceConfigNullMeansUnset) {
  json j = read_json_file(std::string(TRAINPLAN_TEST_DATA_DIR) + "/hf/mistral-nemo-12b/config.json");
  for (const char* key : {"head_dim", "num_key_value_heads", "tie_word_embeddings", "_name_or_path", "attention_dropout"})
    j[key] = nullptr;
  const ModelSpec m = parse_hf_config(j, "nemo/config.json");
  EXPECT_EQ(m.head_dim(), 5120 / 32);  // hidden / heads
  EXPECT_EQ(m.kv_heads, m.heads);
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.name, "nemo");
  EXPECT_EQ(m.dropout, 0.0);
  // A key the architecture needs is not optional: null is refused.
  j["num_hidden_layers"] = nullptr;
  EXPECT_EQ(input_error([&] { parse_hf_config(j, "nemo/config.json"); }),
            "nemo/config.json: num_hidden_layers = null, must be an integer, not null");
}

TEST(NullIsNotAbsent, PlanStrategyOptionalKeys) {
  const json plan = read_json_file(std::string(TRAINPLAN_TEST_DATA_DIR) + "/compare/prediction_pp2.json");
  for (const auto& [key, rule] : {std::pair{"micro_batches", "must be an integer, not null"},
                                  std::pair{"dp_algorithm", "must be one of allreduce|ps|ps-async, not null"},
                                  std::pair{"ps_servers", "must be an integer, not null"},
                                  std::pair{"ps_placement", "must be one of dedicated|colocated, not null"},
                                  std::pair{"grad_compression", "must be a string, not null"}}) {
    json s = plan.at("strategy");
    s[key] = nullptr;
    EXPECT_EQ(input_error([&] { strategy_from_json(s, "p.json"); }), fmt::format("p.json: strategy.{} = null, {}", key, rule));
  }
}

TEST(NullIsNotAbsent, ClusterOptionalKeys) {
  const json h100 = source_file("topologies/dgx-h100.json");
  auto refused = [&](const std::string& pointer) {
    json j = h100;
    j[json::json_pointer(pointer)] = nullptr;
    return input_error([&] { parse_cluster(j, "c.json", kSource); });
  };
  EXPECT_EQ(refused("/node/scale_up_gpus"), "c.json: node.scale_up_gpus = null, must be an integer, not null");
  EXPECT_EQ(refused("/node/peer_link_gbps"), "c.json: node.peer_link_gbps = null, must be a number, not null");
  EXPECT_EQ(refused("/node/in_switch_reduction"), "c.json: node.in_switch_reduction = null, must be a JSON object, not null");
  EXPECT_EQ(refused("/gpu/peak_tflops/mxfp8"), "c.json: gpu.peak_tflops.mxfp8 = null, must be a number, not null");
  EXPECT_EQ(refused("/ops/misaligned_gemm_slowdown"), "c.json: ops.misaligned_gemm_slowdown = null, must be a number, not null");
  EXPECT_EQ(refused("/ops/attention_kernels"), "c.json: ops.attention_kernels = null, must be a JSON object, not null");
}

TEST(NullIsNotAbsent, SoftwareAndDerivedClusterKeys) {
  json sw = source_file("software/megatron-core.json");
  sw["name"] = nullptr;
  EXPECT_EQ(input_error([&] { parse_software(sw, "s.json"); }), "s.json: name = null, must be a string, not null");
  json b200 = source_file("topologies/dgx-b200.json");
  ASSERT_TRUE(b200.at("ops").contains("derive"));  // a derived cluster
  b200["ops"]["derive"]["keep_attention_kernels"] = nullptr;
  EXPECT_EQ(input_error([&] { parse_cluster(b200, "c.json", kSource); }),
            "c.json: ops.derive.keep_attention_kernels = null, must be true or false, not null");
}

}  // namespace
}  // namespace trainplan

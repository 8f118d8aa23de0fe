// Unit tests for sim/json_reader: strict reading of JSON objects, and the exact wording of the
// errors (file, field path, value, rule) that the CLI prints as its one-line message.
#include "sim/json_reader.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

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

TEST(JsonObject, HasCountsAsSeenAndTreatsNullAsAbsent) {
  json j = {{"n_inner", nullptr}, {"x", 3}};
  JsonObject o(j, "f.json");
  EXPECT_FALSE(o.has("n_inner"));
  EXPECT_TRUE(o.has("x"));
  EXPECT_FALSE(o.has("y"));
  EXPECT_NO_THROW(o.finish());
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
  EXPECT_EQ(input_error([&] { o.number("n", 0, 1e6); }), "f.json: n = null, must be a number");
}

TEST(JsonObject, OptionalNumberIsAbsentOrChecked) {
  json j = {{"a", 2.5}, {"b", nullptr}, {"c", 7}};
  JsonObject o(j, "f.json");
  EXPECT_EQ(o.optional_number("a", 0, 5), 2.5);
  EXPECT_EQ(o.optional_number("b", 0, 5), std::nullopt);
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

}  // namespace
}  // namespace trainplan

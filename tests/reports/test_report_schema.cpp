// The result schemas (reports/*_json.hpp): each reader gives back what its writer wrote -- the
// committed golden outputs, read and written again, are the same documents -- and refuses what no
// writer writes: an unknown key in any object, null where the schema has no null, a figure that
// disagrees with the figures it is derived from. Each refusal names the file and the field.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "reports/capacity_json.hpp"
#include "reports/compare.hpp"
#include "reports/comparison_json.hpp"
#include "reports/measurement_json.hpp"
#include "reports/prediction_json.hpp"
#include "reports/search_json.hpp"
#include "sim/check.hpp"
#include "sim/compare.hpp"
#include "sim/json_reader.hpp"

namespace trainplan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kData = TRAINPLAN_TEST_DATA_DIR;

// The document read by its kind's reader and written again by its writer.
json reread(const json& j, const std::string& file) {
  // (A schema that is not a string goes to the prediction reader, which refuses it.)
  const std::string schema = j.at("schema").is_string() ? j.at("schema").get<std::string>() : kPredictionSchema;
  if (schema == kPredictionSchema) return prediction_to_json(prediction_from_json(j, file));
  if (schema == kSearchSchema) return search_to_json(search_from_json(j, file));
  if (schema == kCapacitySchema) {
    const CapacityDoc d = capacity_from_json(j, file);
    return capacity_to_json(d.result, d.context);
  }
  if (schema == kMeasurementSchema) return measurement_to_json(measurement_from_json(j, file));
  const ComparisonDoc d = comparison_from_json(j, file);
  return comparison_to_json(d.comparison, d.prediction_file, d.measurement_file);
}

// Differences between two documents ("" when the same): numbers within 1e-12 relative (a figure
// read in one unit and written in another, e.g. hours and seconds), everything else exactly.
std::string difference(const json& a, const json& b, const std::string& path = "") {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return std::fabs(x - y) <= 1e-12 * std::max(std::fabs(x), std::fabs(y)) ? "" : path + ": " + a.dump() + " vs " + b.dump();
  }
  if (a.type() != b.type() || a.size() != b.size()) return path + ": " + a.dump().substr(0, 80) + " vs " + b.dump().substr(0, 80);
  if (a.is_object()) {
    for (const auto& [k, v] : a.items()) {
      if (!b.contains(k)) return path + "/" + k + " missing";
      if (auto d = difference(v, b.at(k), path + "/" + k); !d.empty()) return d;
    }
  } else if (a.is_array()) {
    for (std::size_t i = 0; i < a.size(); ++i)
      if (auto d = difference(a[i], b[i], path + "/" + std::to_string(i)); !d.empty()) return d;
  } else if (a != b) {
    return path + ": " + a.dump() + " vs " + b.dump();
  }
  return "";
}

// Every document of the schemas the test data holds: the golden outputs of predict, simulate,
// search and capacity, and a comparison and a measurement written from the compare test files.
std::vector<std::pair<std::string, json>> documents() {
  std::vector<std::pair<std::string, json>> out;
  for (const auto& entry : fs::directory_iterator(kData / "golden")) {
    if (entry.path().extension() == ".json") out.emplace_back(entry.path().filename().string(), read_json_file(entry.path()));
  }
  const std::string p = (kData / "compare/prediction_pp2.json").string(), m = (kData / "compare/measurement_pp2.json").string();
  const PredictionDoc pd = prediction_from_json(read_json_file(p), p);
  const Measurement md = measurement_from_json(read_json_file(m), m);
  out.emplace_back("comparison", comparison_to_json(compare(pd.estimate, pd.model, pd.cluster, md), p, m));
  out.emplace_back("measurement", measurement_to_json(md));
  return out;
}

// Expects `f` to throw InputError whose message contains every one of `parts`.
void expect_refused(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error with " << parts.front();
  } catch (const InputError& e) {
    const std::string what = e.what();
    for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

TEST(Schema, EveryDocumentReadsBackAsWritten) {
  const auto docs = documents();
  ASSERT_GE(docs.size(), 15u);
  for (const auto& [name, j] : docs) EXPECT_EQ(difference(j, reread(j, name)), "") << name;
}

// Calls `visit(path, object)` for every object of `j` (a JSON pointer), but not inside `skip`
// subtrees (free-form ones, and sim's strategy object, which its own tests cover).
void each_object(const json& j, const std::string& path, const std::set<std::string>& skip,
                 const std::function<void(const std::string&, const json&)>& visit) {
  if (j.is_object()) {
    visit(path, j);
    for (const auto& [k, v] : j.items())
      if (!skip.count(k)) each_object(v, path + "/" + k, skip, visit);
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) each_object(j[i], path + "/" + std::to_string(i), skip, visit);
  }
}

const std::set<std::string> kFreeForm = {"environment", "strategy"};

TEST(Schema, AnUnknownKeyIsRefusedInEveryObject) {
  for (const auto& [name, doc] : documents()) {
    int objects = 0;
    each_object(doc, "", kFreeForm, [&, &name = name, &doc = doc](const std::string& path, const json&) {
      json bad = doc;
      bad[json::json_pointer(path)]["surplus_key"] = 1;
      expect_refused([&] { (void)reread(bad, name); }, {name, "surplus_key"});
      ++objects;
    });
    EXPECT_GT(objects, 3) << name;
  }
}

// Keys whose value may be null (reports/*_json.hpp says where).
const std::set<std::string> kNullable = {"deadline_days", "budget_usd", "cheapest_within_deadline", "fastest_within_budget",
                                         "cost", "predicted", "measured", "error_pct"};

TEST(Schema, NullIsRefusedWhereTheSchemaHasNone) {
  for (const auto& [name, doc] : documents()) {
    each_object(doc, "", kFreeForm, [&, &name = name, &doc = doc](const std::string& path, const json& o) {
      for (const auto& [k, v] : o.items()) {
        if (v.is_null() || kNullable.count(k) || kFreeForm.count(k)) continue;
        json bad = doc;
        bad[json::json_pointer(path + "/" + k)] = nullptr;
        expect_refused([&] { (void)reread(bad, name); }, {name, k});
      }
    });
  }
}

json golden(const std::string& name) { return read_json_file(kData / "golden" / name); }

TEST(Schema, NullAsTheSchemaSaysItAndNowhereElse) {
  // A capacity option that never finishes (goodput 0) has null failure-aware figures; one that
  // finishes has numbers.
  json cap = golden("capacity_llama3_8b.json");
  json& f = cap["options"][0]["failures"];
  ASSERT_GT(f["goodput"].get<double>(), 0);
  f["cost_usd"] = nullptr;
  expect_refused([&] { (void)capacity_from_json(cap, "c.json"); },
                 {"c.json: options[0].failures.cost_usd = null", "the option finishes"});
  for (const char* k : {"days", "gpu_hours", "cost_usd", "energy_kwh"}) f[k] = nullptr;
  f["goodput"] = 0;
  const CapacityDoc d = capacity_from_json(cap, "c.json");
  EXPECT_DOUBLE_EQ(d.result.options[0].cost_usd_with_failures, 0);
  f["days"] = 1.0;
  expect_refused([&] { (void)capacity_from_json(cap, "c.json"); }, {"failures.days = 1.0", "never finishes"});
}

TEST(Schema, DerivedFiguresMustAgreeWithTheirSources) {
  json s = golden("search_llama2_7b.json");
  s["top"][1]["rank"] = 1;
  expect_refused([&] { (void)search_from_json(s, "s.json"); }, {"s.json: top[1]", "rank must be 2"});
  s = golden("search_llama2_7b.json");
  s["objective_unit"] = "USD/step";
  expect_refused([&] { (void)search_from_json(s, "s.json"); }, {"objective_unit", "tokens/s"});
  json cap = golden("capacity_llama3_8b.json");
  cap["options"][0]["layout"] = "dp1 tp1 pp1";
  expect_refused([&] { (void)capacity_from_json(cap, "c.json"); }, {"options[0].layout", "the layout of best.strategy"});
  json p = golden("predict_llama3_70b_oom.json");
  p["infeasible_reasons"] = json::array();
  expect_refused([&] { (void)prediction_from_json(p, "p.json"); }, {"p.json: infeasible_reasons", "at least one reason"});
}

TEST(Schema, ErrorPctIsThePercentErrorOfItsFigures) {
  const std::string p = (kData / "compare/prediction_pp2.json").string(), m = (kData / "compare/measurement_pp2.json").string();
  PredictionDoc pd = prediction_from_json(read_json_file(p), p);
  pd.estimate.time.step = 1e99;  // both in range; the error is far beyond either
  const Comparison c = compare(pd.estimate, pd.model, pd.cluster, measurement_from_json(read_json_file(m), m));
  json j = comparison_to_json(c, p, m);
  ASSERT_GT(j["time"][0]["error_pct"].get<double>(), kMaxJsonMagnitude);
  EXPECT_EQ(comparison_from_json(j, "c.json").comparison.time[0].error_pct, c.time[0].error_pct);
  EXPECT_EQ(format_error_pct(*c.time[0].error_pct), "+3.9e+100%");
  j["time"][0]["error_pct"] = 12.5;
  expect_refused([&] { (void)comparison_from_json(j, "c.json"); }, {"c.json: time[0].error_pct = 12.5", "100 x"});
  j["time"][0]["error_pct"] = nullptr;
  expect_refused([&] { (void)comparison_from_json(j, "c.json"); }, {"time[0].error_pct = null"});
}

// The experts' all-to-all phase: written only where a run has it, read back, and set beside the
// prediction's EP time by compare; a file without it (every run before, every dense run) reads as 0.
TEST(Schema, ExpertAllToAllPhaseReadsBackAndIsCompared) {
  const std::string p = (kData / "compare/prediction_pp2.json").string(), m = (kData / "compare/measurement_pp2.json").string();
  json mj = read_json_file(m);
  ASSERT_FALSE(mj["time"].contains("ep_comm_s"));
  EXPECT_EQ(measurement_from_json(mj, m).breakdown.ep_comm, 0);
  Measurement md = measurement_from_json(mj, m);
  PredictionDoc pd = prediction_from_json(read_json_file(p), p);
  auto rows = [](const Comparison& c) {
    std::vector<std::string> keys;
    for (const auto& f : c.time) keys.push_back(f.key);
    return keys;
  };
  const auto dense = rows(compare(pd.estimate, pd.model, pd.cluster, md));
  EXPECT_EQ(std::count(dense.begin(), dense.end(), "ep_comm_s"), 0);
  md.breakdown.ep_comm = 0.25;
  md.breakdown.other = std::max(0.0, md.breakdown.other - 0.25);
  const json written = measurement_to_json(md);
  EXPECT_EQ(written["time"]["ep_comm_s"], 0.25);
  EXPECT_EQ(measurement_from_json(written, "m.json").breakdown.ep_comm, 0.25);
  pd.estimate.time.ep_comm = 0.2;
  const Comparison c = compare(pd.estimate, pd.model, pd.cluster, measurement_from_json(written, "m.json"));
  const auto keys = rows(c);
  const auto at = std::find(keys.begin(), keys.end(), "ep_comm_s");
  ASSERT_NE(at, keys.end());
  const auto& f = c.time[static_cast<std::size_t>(at - keys.begin())];
  EXPECT_EQ(f.measured.value_or(-1), 0.25);
  EXPECT_EQ(f.predicted.value_or(-1), 0.2);
}

TEST(Schema, TimelineEventsAreChecked) {
  json sim = golden("simulate_gpt2_pp4.json");
  json& st = sim["simulation"]["timeline"]["stages"][0];
  st["kind"][2] = "nap";
  expect_refused([&] { (void)prediction_from_json(sim, "s.json"); }, {"simulation.timeline.stages[0].kind[2] = \"nap\""});
  sim = golden("simulate_gpt2_pp4.json");
  sim["simulation"]["timeline"]["stages"][0]["end_s"][0] = -1.0;
  expect_refused([&] { (void)prediction_from_json(sim, "s.json"); }, {"end_s[0] = -1.0"});
  sim = golden("simulate_gpt2_pp4.json");
  sim["simulation"]["timeline"]["stages"][0]["chunk"].erase(0);
  expect_refused([&] { (void)prediction_from_json(sim, "s.json"); }, {"must have the same length"});
}

// The simulation must be of the document's layout: its stages, their ranks and its step.
TEST(Schema, SimulationIsOfTheLayout) {
  const json good = golden("simulate_gpt2_pp4.json");
  EXPECT_NO_THROW((void)prediction_from_json(good, "s.json"));
  json sim = good;
  sim["simulation"]["stages"].erase(3);
  expect_refused([&] { (void)prediction_from_json(sim, "s.json"); },
                 {"simulation.stages", "has 3 entries, must have one per pipeline stage (strategy.pp = 4)"});
  sim = good;
  sim["simulation"]["timeline"]["stages"][1]["stage"] = 2;
  expect_refused([&] { (void)prediction_from_json(sim, "s.json"); }, {"simulation.timeline.stages[1].stage = 2", "must be 1"});
  sim = good;
  sim["simulation"]["stages"][2]["ranks"] = json::array({7});
  expect_refused([&] { (void)prediction_from_json(sim, "s.json"); }, {"simulation.stages[2].ranks", "must be ["});
  sim = good;
  sim["simulation"]["step_s"] = 2 * good["simulation"]["step_s"].get<double>();
  expect_refused([&] { (void)prediction_from_json(sim, "s.json"); }, {"simulation.step_s", "must equal time.step_s"});
  // Expert ranks that cannot fold over a stage's ranks have no rank layout to check against.
  sim = good;
  sim["strategy"]["ep"] = 3;
  expect_refused([&] { (void)prediction_from_json(sim, "s.json"); }, {"strategy.ep = 3", "must divide"});
}

TEST(Schema, FailedRunsReadAsTheirFailure) {
  Measurement run;
  run.strategy.global_batch = 1;
  run.strategy.seq_len = 8;
  run.model = "m";
  run.cluster = "cpu-local";
  run.backend = "gloo";
  run.device = "cpu";
  const json j = failed_measurement_to_json(run, RunFailure{});
  const MeasurementDoc d = measurement_doc_from_json(j, "f.json");
  ASSERT_TRUE(d.failure);
  EXPECT_EQ(d.failure->rank, -1);
  EXPECT_EQ(d.failure->allocated, -1);
  EXPECT_EQ(difference(j, failed_measurement_to_json(d.measurement, *d.failure)), "");
  expect_refused([&] { (void)measurement_from_json(j, "f.json"); }, {"f.json: status = \"failed\"", "no figures"});
}

}  // namespace
}  // namespace trainplan

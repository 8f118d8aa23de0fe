// Round trip: every JSON document trainplan writes is accepted by every trainplan reader of its
// schema. Each document here is written by the writer the commands use, from results at the edges
// of what the planner and the executor produce -- figures near the largest a file may hold
// (kMaxJsonMagnitude) and the smallest positive ones, zeros, infeasible plans, empty lists,
// capacity options that never finish, failed runs -- and then read back by the real binary:
// `trainplan report` for every kind, `compare` for predictions and measurements (and report for
// what compare writes), `predict --plan` for predictions and searches. A reader may refuse a
// document only for what the command cannot do with it (compare needs a step time and a run that
// did not fail; --plan a layout), in one line naming the file; never for its schema.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_fixture.hpp"
#include "reports/comparison_json.hpp"
#include "reports/measurement_json.hpp"
#include "reports/prediction_json.hpp"
#include "reports/search_report.hpp"
#include "sim/capacity.hpp"
#include "sim/compare.hpp"
#include "sim/json_reader.hpp"
#include "sim/measurement.hpp"
#include "sim/model_spec.hpp"
#include "sim/simulate.hpp"

namespace trainplan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Result;
using testing::slurp;

// The edges of a figure: near the largest a file may hold, the smallest positive double, zero.
constexpr double kHuge = kMaxJsonMagnitude / 16;  // a sum of 9 memory parts stays below the limit
constexpr double kTiny = std::numeric_limits<double>::denorm_min();

// A layout of gpt2 on dgx-h100 that `predict --plan` accepts: 8 GPUs, two of each dimension.
Strategy layout() {
  Strategy s;
  s.dp = 2;
  s.tp = 2;
  s.pp = 2;
  s.global_batch = 8;
  s.seq_len = 1024;
  return s;
}

// Every figure of the estimate set to `x` (the per-stage parts, the time phases, the rates).
Estimate estimate_of(double x, const Strategy& s = layout()) {
  Estimate e;
  e.strategy = s;
  e.capacity = x;
  for (int st = 0; st < s.pp; ++st) {
    StageMemory m;
    m.stage = st;
    m.weights = m.gradients = m.optimizer = m.activations = m.other = x;
    m.weight_copies = m.temporaries = m.allocator = m.runtime = x;
    e.per_stage.push_back(m);
    e.stage_layers.push_back(6);
    e.peak_memory = std::max(e.peak_memory, m.total());  // as predict sets it: the fullest stage's total
  }
  TimeBreakdown& t = e.time;
  t.step = t.compute = t.recompute = t.tp_comm = t.cp_comm = t.pp_comm = t.dp_comm = t.dp_comm_exposed = t.bubble =
      t.optimizer = x;
  Throughput& p = e.throughput;
  p.tokens_per_s = p.tokens_per_s_per_gpu = p.model_flops_per_step = p.hardware_flops_per_step = x;
  p.model_tflops_per_gpu = p.hardware_tflops_per_gpu = x;
  p.mfu = p.hfu = std::min(x, 1.0);
  if (s.uses_ps()) e.ps = {s.dp, x, x};
  return e;
}

Estimate out_of_memory(double x) {
  Estimate e = estimate_of(x);
  e.feasible = false;
  e.infeasible.push_back({InfeasibleReason::out_of_memory, "", 1, x, x / 2, 0.1});
  e.infeasible.push_back({InfeasibleReason::invalid_strategy, "--tp 3: must divide heads 12", -1, 0, 0, 0});
  return e;
}

json prediction(const Estimate& e) {
  PredictionDoc d = prediction_doc(e);
  d.model = "gpt2";
  d.cluster = "dgx-h100";
  d.software = "megatron-core";
  d.engine = "analytic";
  return prediction_to_json(d);
}

// A measured run of `layout()` whose every time is `step` and every size and rate `x`.
Measurement measurement_of(double step, double x) {
  Measurement m;
  m.strategy = layout();
  m.model = "gpt2";
  m.cluster = "dgx-h100";
  m.backend = "nccl";
  m.device = "cuda";
  m.warmup = 1;
  for (int i = 0; i < 2; ++i) {
    PhaseTimes p;
    p.forward = p.backward = p.recompute = p.tp_comm = p.cp_comm = p.pp_comm = p.dp_comm = p.dp_comm_exposed =
        p.bubble = p.optimizer = p.other = step;
    m.per_step.push_back({1 + i, step, 0, p});
  }
  for (int r = 0; r < 8; ++r) {
    RankMeasurement rm;
    rm.rank = r;
    rm.coords = {r % 2, 0, (r / 2) % 2, r / 4};
    rm.peak_allocated = rm.peak_reserved = rm.max_rss = x;
    rm.dp_bytes_sent = x;
    rm.phases = m.per_step[0].phases;
    m.ranks.push_back(rm);
  }
  summarize(m);
  m.throughput.tokens_per_s = m.throughput.tokens_per_s_per_gpu = m.throughput.model_flops_per_step = x;
  m.throughput.model_tflops_per_gpu = x;
  return m;
}

class RoundTrip : public testing::CliTest {
 protected:
  std::string write(const std::string& name, const json& j) const {
    const fs::path p = dir_ / name;
    std::ofstream(p) << j.dump(2) << "\n";
    return p.string();
  }
  // `trainplan report FILE` must write its page.
  void expect_report(const std::string& file) const {
    const std::string html = (dir_ / "page.html").string();
    fs::remove(html);
    const Result r = run("report '" + file + "' --html '" + html + "'");
    EXPECT_EQ(r.code, 0) << file << ": " << r.err;
    EXPECT_TRUE(fs::exists(html)) << file;
  }
  // `predict --plan FILE` must take the layout (a plan that does not fit still exits 3).
  void expect_plan(const std::string& file) const {
    const Result r = run("predict --plan '" + file + "'");
    EXPECT_TRUE(r.code == 0 || r.code == 3) << file << ": " << r.err;
  }
  // `compare P M` must write its comparison, which report then reads, and its own page.
  void expect_compare(const std::string& p, const std::string& m) const {
    const std::string out = (dir_ / "cmp.json").string(), html = (dir_ / "cmp.html").string();
    fs::remove(out);
    const Result r = run("compare '" + p + "' '" + m + "' --json '" + out + "' --html '" + html + "'");
    EXPECT_EQ(r.code, 0) << p << " vs " << m << ": " << r.err;
    if (r.code == 0) expect_report(out);
  }
  // A refusal that is the command's, not the schema's: exit 2, one line naming the file and `why`.
  void expect_refused(const std::string& args, const std::string& file, const std::string& why) const {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
  }
};

// --- capacity: an option that never finishes writes null failure-aware figures ---

TEST_F(RoundTrip, CapacityRunWhoseOptionsNeverFinish) {
  // A failure every 3.6 s per GPU and restarts of a day: no option ever finishes (goodput 0).
  const std::string cap = (dir_ / "cap.json").string(), html = (dir_ / "cap.html").string();
  const Result r = run("capacity --model gpt2 --tokens 10B --clusters dgx-h100 --gpus-range 8..16 --threads 1 "
                       "--mtbf-hours 0.001 --restart-minutes 1440 --json " + cap + " --html " + html);
  ASSERT_EQ(r.code, 3) << r.err;  // no usable option
  EXPECT_TRUE(fs::exists(html)) << "capacity --html refused its own result";
  const json j = read(cap);
  ASSERT_TRUE(j["options"][0]["failures"]["cost_usd"].is_null()) << "the case this test is about";
  expect_report(cap);
}

CapacityResult capacity_edges() {
  CapacityResult r;
  CapacityOption never;  // feasible, but failures stop it for good
  never.cluster = "dgx-h100";
  never.gpus = 16;
  never.feasible = true;
  never.best = estimate_of(kHuge);
  never.days = never.hours = never.gpu_hours = never.cost_usd = never.energy_kwh = kHuge;
  never.price_per_gpu_hour = never.power_per_gpu_w = kTiny;
  never.with_failures = true;
  never.goodput.job_mtbf = kTiny;
  never.elastic = ElasticOption{8, false, "no valid layout", {}, 0, 0};
  CapacityOption fine = never;  // finishes, with the smallest figures
  fine.gpus = 8;
  fine.best = estimate_of(kTiny);
  fine.days = fine.hours = fine.gpu_hours = fine.cost_usd = fine.energy_kwh = kTiny;
  fine.goodput.goodput = 1;
  fine.days_with_failures = fine.gpu_hours_with_failures = fine.cost_usd_with_failures = fine.energy_kwh_with_failures = kTiny;
  fine.elastic = ElasticOption{0, true, "", estimate_of(kTiny), kTiny, 0};
  CapacityOption none;  // nothing fits
  none.cluster = "dgx-a100-40g";
  none.gpus = 1 << 24;
  none.why = "no valid layout";
  r.options = {never, fine, none};
  r.pareto = {1};
  r.reliability = Reliability{"assumed", kMtbfHoursMin, kCheckpointGbpsMax * kGB, kRestartMinutesMax * 60};
  return r;
}

TEST_F(RoundTrip, CapacityEdgesAreReadBack) {
  const CapacityContext ctx{"gpt2", 1e19, 1 << 30, 1 << 24, std::nullopt, std::nullopt};
  expect_report(write("cap.json", capacity_to_json(capacity_edges(), ctx)));
  CapacityResult empty;
  empty.options = {capacity_edges().options[2]};
  empty.ranking_rule = RankingRule::cheapest_in_deadline;  // what plan_capacity picks with a deadline
  expect_report(write("none.json", capacity_to_json(empty, {"gpt2", 1, 1, 1, 1e-6, 1e-6})));
}

// --- compare: figures far apart give an error beyond the figures' own magnitude ---

TEST_F(RoundTrip, ComparisonOfFiguresFarApart) {
  // Both files in range (a step of 1e99 s predicted, 1 us measured): the errors are ~1e107 %.
  const std::string p = write("p.json", prediction(estimate_of(kHuge)));
  const std::string m = write("m.json", measurement_to_json(measurement_of(1e-6, kTiny)));
  ASSERT_NO_FATAL_FAILURE(expect_compare(p, m));
  ASSERT_TRUE(fs::exists(dir_ / "cmp.json"));
  const json c = read(dir_ / "cmp.json");
  ASSERT_GT(c["time"][0]["error_pct"].get<double>(), kMaxJsonMagnitude) << "the case this test is about";
  // And the other way round: a tiny prediction of a huge measurement (-100%), and zeros (n/a).
  expect_compare(write("p2.json", prediction(estimate_of(kTiny))), write("m2.json", measurement_to_json(measurement_of(kHuge, kHuge))));
  expect_compare(write("p3.json", prediction(estimate_of(1e-6))), write("m3.json", measurement_to_json(measurement_of(1e-6, 0))));
}

// --- measurement: a failed run is a document of the schema too ---

TEST_F(RoundTrip, FailedRunIsReportedAndCompareSaysWhy) {
  Measurement run_ = measurement_of(1, 1);
  run_.environment = {{"host", "x"}};
  const RunFailure unknown;  // a rank killed by a signal: rank, step and memory unknown (null)
  const std::string f = write("failed.json", failed_measurement_to_json(run_, unknown));
  ASSERT_TRUE(read(f)["failure"]["rank"].is_null());
  expect_report(f);
  const std::string f2 = write("failed2.json", failed_measurement_to_json(run_, {3, 7, "backward", "CUDA out of memory", kHuge, kHuge, kHuge, 0}));
  expect_report(f2);
  const std::string p = write("p.json", prediction(estimate_of(1)));
  expect_refused("compare '" + p + "' '" + f2 + "'", "failed2.json", "CUDA out of memory");
  // Its successful counterpart at both edges.
  expect_report(write("ok.json", measurement_to_json(measurement_of(kHuge, kHuge))));
  expect_report(write("ok2.json", measurement_to_json(measurement_of(1e-6, 0))));
}

// --- predictions: every optional part, at every edge ---

TEST_F(RoundTrip, PredictionEdges) {
  const std::string m = write("m.json", measurement_to_json(measurement_of(1, 1)));
  for (double x : {kHuge, kTiny, 1.0}) {
    PredictionDoc d = prediction_doc(estimate_of(x));
    d.model = "gpt2";
    d.cluster = "dgx-h100";
    d.engine = "des";
    d.cost = PredictionCost{true, x, x, 8, "price_per_gpu_hour_usd of cluster file dgx-h100"};
    StageDetail st{0, 1 << 20, x, {}, x, x, x, x, x};
    st.rows = {{LayerRow::Kind::embedding, 0, 0, 1, 1, LayerKind{}, x, x, x, x, x, x, x, x, x, x, x, x},
               {LayerRow::Kind::layers, 0, 0, 6, 6, LayerKind{}, x, x, x, x, x, x, x, x, x, x, x, x},
               {LayerRow::Kind::layers, 0, 6, 3, 5, LayerKind{true, AttentionWindow::sliding}, x, x, x, x, x, x, x, x, x, x, x, x},
               {LayerRow::Kind::head, 0, 0, 1, 1, LayerKind{}, x, x, x, x, x, x, x, x, x, x, x, x}};
    d.layers = std::vector<StageDetail>{st, StageDetail{}};
    const std::string f = write(fmt::format("p{}.json", x), prediction_to_json(d));
    SCOPED_TRACE(f);
    expect_report(f);
    expect_plan(f);
    expect_compare(f, m);
  }
  // Infeasible with its reasons and no step time, unpriced; a plan with parameter servers.
  PredictionDoc oom = prediction_doc(out_of_memory(0));
  oom.model = "gpt2";
  oom.cluster = "dgx-h100";
  oom.cost = PredictionCost{};
  const std::string f = write("oom.json", prediction_to_json(oom));
  expect_report(f);
  expect_plan(f);
  expect_refused("compare '" + f + "' '" + m + "'", "oom.json", "time.step_s = 0");
  Strategy ps = layout();
  ps.dp_algorithm = DpAlgorithm::ps_async;
  ps.ps_servers = 1 << 20;
  ps.grad_compression = {CompressionKind::powersgd, 1 << 16};
  const std::string fps = write("ps.json", prediction(estimate_of(kHuge, ps)));
  expect_report(fps);
  expect_compare(fps, m);
}

// --- the model a plan carries: every model trainplan reads, and one at the edges of the format ---

SearchResult search_edges(double x, double value);  // below, with the search tests

// The space `layout()` was searched in.
SearchSpace layout_space() {
  SearchSpace space;
  space.gpus = 8;
  space.global_batch = 8;
  space.seq_len = 1024;
  return space;
}

// Every built-in model and every Hugging Face config of the test data, as a plan carries it.
std::vector<ModelSpec> carried_models() {
  std::vector<ModelSpec> out;
  for (const auto& e : fs::directory_iterator(fs::path(TRAINPLAN_SOURCE_DIR) / "models")) {
    if (e.path().extension() == ".json") out.push_back(load_model(e.path().string(), TRAINPLAN_SOURCE_DIR));
  }
  for (const auto& e : fs::directory_iterator(fs::path(TRAINPLAN_TEST_DATA_DIR) / "hf")) {
    if (e.is_directory()) out.push_back(load_model(e.path().string(), TRAINPLAN_SOURCE_DIR));
  }
  return out;
}

TEST(CarriedModel, EveryModelReadsBackAsWritten) {
  const std::vector<ModelSpec> models = carried_models();
  ASSERT_GE(models.size(), 20u);
  for (const ModelSpec& m : models) {
    SCOPED_TRACE(m.name);
    PredictionDoc d = prediction_doc(estimate_of(1));
    d.model = m.name;
    d.model_spec = m;
    const PredictionDoc back = prediction_from_json(prediction_to_json(d), "p.json");
    ASSERT_TRUE(back.model_spec.has_value());
    EXPECT_EQ(to_json(*back.model_spec), to_json(m));
    const SearchSpace space = layout_space();
    SearchContext ctx{m.name, "dgx-h100", &space, Objective::time, 1};
    ctx.model_spec = &m;
    ctx.software = "pytorch-eager";
    const SearchDoc s = search_from_json(search_to_json(search_edges(1, 1), ctx), "s.json");
    EXPECT_EQ(s.software, "pytorch-eager");
    ASSERT_TRUE(s.model_spec.has_value());
    EXPECT_EQ(to_json(*s.model_spec), to_json(m));
  }
}

// A model no name loads (so --plan must run the one it carries), with every optional key of the
// model format at an edge: explicit head_dim, dropout just below 1, ALiBi, untied embeddings.
ModelSpec edge_model() {
  ModelSpec m = load_model("gpt2", TRAINPLAN_SOURCE_DIR);
  m.name = "carried-only model";
  m.layers = 2;
  m.explicit_head_dim = 2;
  m.dropout = 0.999;
  m.position = Position::alibi;
  m.tied_embeddings = false;
  m.vocab = 1 << 24;
  return m;
}

TEST_F(RoundTrip, CarriedModelAtTheEdgesRunsAsThePlan) {
  const ModelSpec m = edge_model();
  PredictionDoc d = prediction_doc(estimate_of(1));
  d.model = m.name;
  d.cluster = "dgx-h100";
  d.model_spec = m;
  const std::string f = write("p.json", prediction_to_json(d));
  expect_report(f);
  expect_plan(f);
  const SearchSpace space = layout_space();
  SearchContext ctx{m.name, "dgx-h100", &space, Objective::throughput, 1};
  ctx.model_spec = &m;
  const std::string s = write("s.json", search_to_json(search_edges(1, -1), ctx));
  expect_report(s);
  expect_plan(s);
}

// --- simulate: the timeline of every stream and event kind ---

Timeline timeline_edges(double end) {
  Timeline t;
  t.step = end;
  const std::pair<Stream, EventKind> kinds[] = {
      {Stream::compute, EventKind::forward},          {Stream::compute, EventKind::recompute},
      {Stream::compute, EventKind::backward},         {Stream::compute, EventKind::backward_weight},
      {Stream::compute, EventKind::optimizer},        {Stream::pp_forward, EventKind::send_activation},
      {Stream::pp_backward, EventKind::send_gradient}, {Stream::dp, EventKind::grad_reduce},
      {Stream::dp, EventKind::zero3_gather},          {Stream::dp, EventKind::param_gather},
      {Stream::dp, EventKind::ps_push_pull},          {Stream::ps_server, EventKind::ps_update}};
  for (int stage = 0; stage < 3; ++stage) {
    StageUsage u;
    u.stage = stage;
    u.compute = u.end = stage == 2 ? 0 : end;  // stage 2 runs nothing
    t.stages.push_back(u);
    if (stage == 2) continue;
    for (const auto& [stream, kind] : kinds) t.events.push_back({stage, stream, kind, -1, -1, 0, end, -1});
    t.events.push_back({stage, Stream::compute, EventKind::forward, 1 << 30, 7, end, end, -1});
  }
  return t;
}

TEST_F(RoundTrip, SimulationEdges) {
  const std::string m = write("m.json", measurement_to_json(measurement_of(1, 1)));
  Strategy three_stages = layout();  // as many stages as the timeline, two ranks each
  three_stages.dp = 1;
  three_stages.pp = 3;
  const std::vector<std::vector<int>> ranks = replica_stage_ranks(three_stages);
  ASSERT_EQ(ranks, (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}}));
  for (double end : {kHuge, kTiny, 0.0}) {
    PredictionDoc d = prediction_doc(estimate_of(end == 0 ? 1 : end, three_stages));
    d.model = "gpt2";
    d.cluster = "dgx-h100";
    d.engine = "des";
    Timeline t = timeline_edges(end);
    t.step = d.estimate.time.step;  // simulation.step_s is time.step_s (compare needs a step above 0)
    d.simulation = simulation_doc(t, ranks, true);
    const std::string f = write("sim.json", prediction_to_json(d));
    SCOPED_TRACE(end);
    expect_report(f);
    expect_plan(f);
    expect_compare(f, m);
    d.simulation = simulation_doc(t, ranks, false);  // the summary alone (no --json or --html)
    expect_report(write("summary.json", prediction_to_json(d)));
  }
}

// --- search: empty lists, every list at the edges ---

// `value`: the objective value of the top entries, as search ranks them (objective_value()).
SearchResult search_edges(double x, double value) {
  SearchResult r;
  r.top = {estimate_of(x), estimate_of(x)};
  r.top_value = {value, value};
  r.pareto = {estimate_of(x)};
  r.infeasible = {out_of_memory(x)};
  r.points = {{x, x}, {kHuge, 0}, {kTiny, kHuge}};
  r.stats.candidates = r.stats.evaluated = r.stats.feasible = (1LL << 62);
  r.stats.infeasible_by_reason = {{InfeasibleReason::out_of_memory, 1LL << 62}, {InfeasibleReason::unsupported_dtype, 0}};
  r.stats.pruned_out_of_memory = r.stats.pruned_by_bound = 1LL << 62;
  r.stats.layouts = std::numeric_limits<int>::max();
  r.stats.max_gpus_considered = 1 << 24;
  r.stats.elapsed_s = kHuge;
  r.stats.refined = 2;
  return r;
}

TEST_F(RoundTrip, SearchEdges) {
  SearchSpace space;
  space.gpus = 1 << 24;
  space.global_batch = 1 << 30;
  space.seq_len = 1 << 24;
  space.dp_algorithms = {DpAlgorithm::allreduce, DpAlgorithm::ps, DpAlgorithm::ps_async};
  space.grad_compressions = {GradCompression{}, {CompressionKind::bf16, 0}, {CompressionKind::powersgd, 1 << 16}};
  for (Objective o : {Objective::throughput, Objective::cost, Objective::time}) {
    for (double x : {kHuge, kTiny}) {
      const SearchContext ctx{"gpt2", "dgx-h100", &space, o, 1e6};
      // Throughput is ranked as minus tokens/s, cost and time as they are.
      const std::string f = write("search.json", search_to_json(search_edges(x, o == Objective::throughput ? -x : x), ctx));
      SCOPED_TRACE(f);
      expect_report(f);
      expect_plan(f);
    }
  }
  // Nothing valid in the space: every list empty, no candidates.
  SearchSpace narrow;
  narrow.seq_len = 1;
  const std::string empty = write("empty.json", search_to_json(SearchResult{}, {"gpt2", "dgx-h100", &narrow, Objective::time, 1}));
  expect_report(empty);
  expect_refused("predict --plan '" + empty + "'", "empty.json", "top is empty");
}

}  // namespace
}  // namespace trainplan

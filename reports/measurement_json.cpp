#include "reports/measurement_json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "reports/schema_fields.hpp"
#include "sim/check.hpp"
#include "sim/json_reader.hpp"

namespace trainplan {

using nlohmann::json;

namespace {

using schema::kInf;

json phases_to_json(const PhaseTimes& p) {
  json j = {{"compute_s", p.compute()},   {"forward_s", p.forward},       {"backward_s", p.backward},
            {"recompute_s", p.recompute}, {"tp_comm_s", p.tp_comm},       {"cp_comm_s", p.cp_comm},
            {"pp_comm_s", p.pp_comm},     {"dp_comm_s", p.dp_comm},       {"dp_comm_exposed_s", p.dp_comm_exposed},
            {"bubble_s", p.bubble},       {"optimizer_s", p.optimizer},   {"other_s", p.other}};
  if (p.ep_comm > 0) j["ep_comm_s"] = p.ep_comm;  // runs with expert parallelism (older files have none)
  return j;
}

json coords_to_json(const RankCoord& c) { return {{"tp", c.tp}, {"cp", c.cp}, {"dp", c.dp}, {"pp", c.pp}}; }

using schema::check_consistent;

// A measured training step takes at least a microsecond (one kernel launch): a positive 1e-300 s
// would pass "> 0" and make compare's relative errors 1e300 %.
constexpr double kMinMeasuredStep = 1e-6;

// Reads PHASES keys from `o`; `alone`: they are all of its keys (else the caller reads the others
// and calls finish()).
PhaseTimes read_phases(const JsonObject& o, bool alone) {
  PhaseTimes p;
  auto s = [&](const char* k) { return schema::seconds(o, k); };
  p.forward = s("forward_s");
  p.backward = s("backward_s");
  p.recompute = s("recompute_s");
  p.tp_comm = s("tp_comm_s");
  p.cp_comm = s("cp_comm_s");
  p.pp_comm = s("pp_comm_s");
  if (schema::has(o, "ep_comm_s")) p.ep_comm = s("ep_comm_s");
  p.dp_comm = s("dp_comm_s");
  p.dp_comm_exposed = s("dp_comm_exposed_s");
  p.bubble = s("bubble_s");
  p.optimizer = s("optimizer_s");
  p.other = s("other_s");
  check_consistent(o, "compute_s", s("compute_s"), p.compute(), "must equal forward_s + backward_s");
  if (alone) o.finish();
  return p;
}

RankCoord read_coords(const JsonObject& o) {
  RankCoord c;
  auto i = [&](const char* k) { return static_cast<int>(o.integer(k, 0, 1 << 24)); };
  c.tp = i("tp");
  c.cp = i("cp");
  c.dp = i("dp");
  c.pp = i("pp");
  o.finish();
  return c;
}

void read_run(const JsonObject& run, Measurement& m, bool ok) {
  m.backend = run.choice("backend", {"nccl", "gloo"});
  m.device = run.choice("device", {"cuda", "cpu"});
  m.warmup = static_cast<int>(run.integer("warmup_steps", 0, 1 << 24));
  if (ok) m.steps = static_cast<int>(run.integer("measured_steps", 1, 1 << 24));
  m.seed = run.integer("seed", std::numeric_limits<long long>::min(), std::numeric_limits<long long>::max());
  if (schema::has(run, "requested_dtype")) m.requested_dtype = run.choice("requested_dtype", {"bf16", "fp16", "fp8", "fp32"});
  run.finish();
}

std::vector<StepRecord> read_steps(const JsonObject& root, int measured_steps, int warmup) {
  std::vector<StepRecord> out;
  for (const JsonObject& s : root.objects("steps", 1)) {
    StepRecord r;
    r.step = static_cast<int>(s.integer("step", 0, 1 << 30));
    // The measured steps follow the warm-up ones: numbered warmup_steps, warmup_steps + 1, ...
    if (r.step != warmup + static_cast<int>(out.size())) {
      throw s.error("step", fmt::format("must be {} (run.warmup_steps + its index)", warmup + static_cast<int>(out.size())));
    }
    r.wall = s.number("wall_s", kMinMeasuredStep, kInf);
    r.loss = s.number("loss", 0, kInf);  // cross-entropy: never negative
    r.phases = read_phases(s.object("phases"), true);
    s.finish();
    out.push_back(r);
  }
  if (static_cast<int>(out.size()) != measured_steps) {
    throw root.error("steps", fmt::format("must hold run.measured_steps = {} entries", measured_steps));
  }
  return out;
}

Spread read_step_time(const JsonObject& st) {
  Spread s;
  s.median = st.number("median_s", kMinMeasuredStep, kInf);
  s.mean = st.number("mean_s", kMinMeasuredStep, kInf);
  s.stdev = st.number("stdev_s", 0, kInf);
  s.min = st.number("min_s", kMinMeasuredStep, kInf);
  s.max = st.number("max_s", kMinMeasuredStep, kInf);
  s.count = static_cast<int>(st.integer("count", 1, 1 << 30));
  if (s.min > s.median || s.median > s.max) throw st.error("median_s", "must lie between min_s and max_s");
  st.finish();
  return s;
}

RankMeasurement read_rank(const JsonObject& r) {
  RankMeasurement rm;
  rm.rank = static_cast<int>(r.integer("rank", 0, 1 << 24));
  rm.coords = read_coords(r.object("coords"));
  rm.peak_allocated = r.number("peak_allocated_bytes", 0, kInf);
  rm.peak_reserved = r.number("peak_reserved_bytes", 0, kInf);
  rm.max_rss = r.number("max_rss_bytes", 0, kInf);
  rm.dp_bytes_sent = schema::has(r, "dp_bytes_sent_per_step") ? r.number("dp_bytes_sent_per_step", 0, kInf) : 0;
  schema::check_consistent(r, "peak_bytes", r.number("peak_bytes", 0, kInf), rm.peak_bytes(),
                           "must equal peak_reserved_bytes, or max_rss_bytes when that is 0");
  rm.phases = read_phases(r.object("phases"), true);
  r.finish();
  return rm;
}

// As exec writes them (sim/measurement.cpp summarize): the ranks in order, each at coordinates
// inside the strategy's sizes; one stage entry per pipeline stage, in order, its peak the largest
// of its ranks'; the peak the largest of the stages'.
void read_memory(const JsonObject& mem, Measurement& m) {
  const Strategy& s = m.strategy;
  m.peak_memory = mem.number("peak_bytes", 0, kInf);
  const std::vector<JsonObject> ranks = mem.objects("per_rank", 1);
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    m.ranks.push_back(read_rank(ranks[i]));
    const RankMeasurement& r = m.ranks.back();
    if (r.rank != static_cast<int>(i)) throw ranks[i].error("rank", fmt::format("must be {} (the ranks in order)", i));
    for (const auto& [key, at, size] : {std::tuple{"tp", r.coords.tp, s.tp}, std::tuple{"cp", r.coords.cp, s.cp},
                                        std::tuple{"dp", r.coords.dp, s.dp}, std::tuple{"pp", r.coords.pp, s.pp}}) {
      if (at >= size) {
        throw InputError(fmt::format("{}: {}.{} = {}, must be below strategy.{} = {}", ranks[i].file(),
                                     ranks[i].field("coords"), key, at, key, size));
      }
    }
  }
  const std::vector<JsonObject> stages = mem.objects("per_stage");
  schema::check_stage_count(mem, "per_stage", stages.size(), s.pp);
  double largest = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const JsonObject& o = stages[i];
    const StagePeak p{static_cast<int>(o.integer("stage", 0, 1 << 24)), o.number("peak_bytes", 0, kInf)};
    schema::check_stage_index(o, p.stage, i);
    double ranks_peak = 0;
    for (const RankMeasurement& r : m.ranks)
      if (r.coords.pp == p.stage) ranks_peak = std::max(ranks_peak, r.peak_bytes());
    check_consistent(o, "peak_bytes", p.peak, ranks_peak, "must equal the largest peak_bytes of the stage's per_rank entries");
    o.finish();
    m.per_stage.push_back(p);
    largest = std::max(largest, p.peak);
  }
  check_consistent(mem, "peak_bytes", m.peak_memory, largest, "must equal the largest per_stage peak_bytes");
  mem.finish();
}

MeasuredThroughput read_measured_throughput(const JsonObject& t) {
  MeasuredThroughput p;
  p.tokens_per_s = t.number("tokens_per_s", 0, kInf);
  p.tokens_per_s_per_gpu = t.number("tokens_per_s_per_gpu", 0, kInf);
  p.model_flops_per_step = t.number("model_flops_per_step", 0, kInf);
  p.model_tflops_per_gpu = t.number("model_tflops_per_gpu", 0, kInf);
  t.finish();
  return p;
}

// The figures of a successful run: steps, their spread, the phase medians, memory, throughput.
void read_figures(const JsonObject& root, Measurement& m) {
  m.per_step = read_steps(root, m.steps, m.warmup);
  m.step_time = read_step_time(root.object("step_time"));
  if (m.step_time.count != m.steps) {
    throw InputError(fmt::format("{}: step_time.count = {}, must equal run.measured_steps = {}", root.file(),
                                 m.step_time.count, m.steps));
  }
  {
    const JsonObject t = root.object("time");
    m.breakdown = read_phases(t, false);
    check_consistent(t, "step_s", t.number("step_s", kMinMeasuredStep, kInf), m.step_time.median,
                     "must equal step_time.median_s");
    t.finish();
  }
  read_memory(root.object("memory"), m);
  m.throughput = read_measured_throughput(root.object("throughput"));
  // Derived: the largest per-rank figure.
  m.dp_bytes_sent = 0;
  for (const RankMeasurement& r : m.ranks) m.dp_bytes_sent = std::max(m.dp_bytes_sent, r.dp_bytes_sent);
  if (schema::has(root, "dp_bytes_sent_per_step")) {
    check_consistent(root, "dp_bytes_sent_per_step", root.number("dp_bytes_sent_per_step", 0, kInf), m.dp_bytes_sent,
                     "must equal the largest per_rank figure");
  }
}

// -1 for a figure the failure record does not know (null in the file).
double known_or_minus_one(const JsonObject& o, const char* key) {
  return schema::nullable_number(o, key, 0, kInf).value_or(-1);
}

RunFailure read_failure(const JsonObject& o) {
  RunFailure f;
  f.rank = static_cast<int>(schema::nullable_integer(o, "rank", 0, 1 << 24).value_or(-1));
  f.step = static_cast<int>(schema::nullable_integer(o, "step", 0, 1 << 30).value_or(-1));
  f.phase = schema::text(o, "phase");
  f.error = schema::text(o, "error");
  const JsonObject mem = o.object("memory");
  f.allocated = known_or_minus_one(mem, "allocated_bytes");
  f.reserved = known_or_minus_one(mem, "reserved_bytes");
  f.capacity = known_or_minus_one(mem, "capacity_bytes");
  f.rss = known_or_minus_one(mem, "rss_bytes");
  mem.finish();
  o.finish();
  return f;
}

}  // namespace

json measurement_to_json(const Measurement& m) {
  json steps = json::array();
  for (const StepRecord& r : m.per_step) {
    steps.push_back({{"step", r.step}, {"wall_s", r.wall}, {"loss", r.loss}, {"phases", phases_to_json(r.phases)}});
  }
  json per_rank = json::array();
  for (const RankMeasurement& r : m.ranks) {
    per_rank.push_back({{"rank", r.rank},
                        {"coords", coords_to_json(r.coords)},
                        {"peak_allocated_bytes", r.peak_allocated},
                        {"peak_reserved_bytes", r.peak_reserved},
                        {"max_rss_bytes", r.max_rss},
                        {"peak_bytes", r.peak_bytes()},
                        {"dp_bytes_sent_per_step", r.dp_bytes_sent},
                        {"phases", phases_to_json(r.phases)}});
  }
  json per_stage = json::array();
  for (const StagePeak& s : m.per_stage) per_stage.push_back({{"stage", s.stage}, {"peak_bytes", s.peak}});

  json time = phases_to_json(m.breakdown);
  time["step_s"] = m.step_time.median;
  const Spread& st = m.step_time;
  const MeasuredThroughput& t = m.throughput;
  json out = {{"schema", kMeasurementSchema},
          {"status", "ok"},
          {"strategy", to_json(m.strategy)},
          {"model", m.model},
          {"cluster", m.cluster},
          {"run",
           {{"backend", m.backend},
            {"device", m.device},
            {"warmup_steps", m.warmup},
            {"measured_steps", m.steps},
            {"seed", m.seed}}},
          {"environment", m.environment},
          {"steps", steps},
          {"step_time",
           {{"median_s", st.median}, {"mean_s", st.mean}, {"stdev_s", st.stdev}, {"min_s", st.min}, {"max_s", st.max},
            {"count", st.count}}},
          {"time", time},
          {"memory", {{"peak_bytes", m.peak_memory}, {"per_stage", per_stage}, {"per_rank", per_rank}}},
          {"throughput",
           {{"tokens_per_s", t.tokens_per_s},
            {"tokens_per_s_per_gpu", t.tokens_per_s_per_gpu},
            {"model_flops_per_step", t.model_flops_per_step},
            {"model_tflops_per_gpu", t.model_tflops_per_gpu}}}};
  if (!m.software.empty()) out["software"] = m.software;
  if (!m.executor.empty()) out["executor"] = m.executor;
  if (!m.requested_dtype.empty()) out["run"]["requested_dtype"] = m.requested_dtype;
  out["dp_bytes_sent_per_step"] = m.dp_bytes_sent;  // the busiest rank's (memory.per_rank has each)
  return out;
}

json failed_measurement_to_json(const Measurement& m, const RunFailure& f) {
  auto known = [](double x) { return x >= 0 ? json(x) : json(nullptr); };
  json out = {{"schema", kMeasurementSchema},
          {"status", "failed"},
          {"strategy", to_json(m.strategy)},
          {"model", m.model},
          {"cluster", m.cluster},
          {"run", {{"backend", m.backend}, {"device", m.device}, {"warmup_steps", m.warmup}, {"seed", m.seed}}},
          {"environment", m.environment},
          {"failure",
           {{"rank", f.rank >= 0 ? json(f.rank) : json(nullptr)},
            {"step", f.step >= 0 ? json(f.step) : json(nullptr)},
            {"phase", f.phase},
            {"error", f.error},
            {"memory",
             {{"allocated_bytes", known(f.allocated)},
              {"reserved_bytes", known(f.reserved)},
              {"capacity_bytes", known(f.capacity)},
              {"rss_bytes", known(f.rss)}}}}}};
  if (!m.executor.empty()) out["executor"] = m.executor;
  if (!m.requested_dtype.empty()) out["run"]["requested_dtype"] = m.requested_dtype;
  return out;
}

MeasurementDoc measurement_doc_from_json(const json& j, const std::string& file) {
  const JsonObject root(j, file);
  schema::check_schema(root, kMeasurementSchema, "is this a measurement file?");
  // Files written before "status" existed are successful runs.
  const std::string status = schema::has(root, "status") ? root.choice("status", {"ok", "failed"}) : "ok";
  const bool ok = status == "ok";
  MeasurementDoc d;
  Measurement& m = d.measurement;
  m.strategy = strategy_from_json(root.raw("strategy"), file);
  m.model = root.string("model");
  m.cluster = root.string("cluster");
  if (ok && schema::has(root, "software")) m.software = root.string("software");
  if (schema::has(root, "executor")) m.executor = root.string("executor");
  read_run(root.object("run"), m, ok);
  const json& env = root.raw("environment");
  if (!env.is_object()) throw root.error("environment", "must be a JSON object");
  m.environment = env;
  if (ok) {
    read_figures(root, m);
  } else {
    d.failure = read_failure(root.object("failure"));
  }
  root.finish();
  return d;
}

Measurement measurement_from_json(const json& j, const std::string& file) {
  MeasurementDoc d = measurement_doc_from_json(j, file);
  if (d.failure) {
    throw InputError(fmt::format("{}: status = \"failed\", the run failed ({}); a failed run has no figures to read",
                                 file, d.failure->error.empty() ? "no error recorded" : d.failure->error));
  }
  return std::move(d.measurement);
}

}  // namespace trainplan

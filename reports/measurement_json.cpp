#include "reports/measurement_json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "sim/check.hpp"
#include "sim/json_reader.hpp"

namespace trainplan {

using nlohmann::json;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

json phases_to_json(const PhaseTimes& p) {
  return {{"compute_s", p.compute()},   {"forward_s", p.forward},       {"backward_s", p.backward},
          {"recompute_s", p.recompute}, {"tp_comm_s", p.tp_comm},       {"cp_comm_s", p.cp_comm},
          {"pp_comm_s", p.pp_comm},     {"dp_comm_s", p.dp_comm},       {"dp_comm_exposed_s", p.dp_comm_exposed},
          {"bubble_s", p.bubble},       {"optimizer_s", p.optimizer},   {"other_s", p.other}};
}

json coords_to_json(const RankCoord& c) { return {{"tp", c.tp}, {"cp", c.cp}, {"dp", c.dp}, {"pp", c.pp}}; }

// Two figures that the writer derives from one another must agree (to rounding in the file).
void check_consistent(const JsonObject& o, const std::string& key, double stored, double expected,
                      const std::string& rule) {
  const double tol = 1e-9 * std::max({1.0, std::fabs(stored), std::fabs(expected)});
  if (std::fabs(stored - expected) > tol) throw o.error(key, rule);
}

// A measured training step takes at least a microsecond (one kernel launch): a positive 1e-300 s
// would pass "> 0" and make compare's relative errors 1e300 %.
constexpr double kMinMeasuredStep = 1e-6;

// Reads PHASES keys from `o` (which may hold other keys too; the caller calls finish()).
PhaseTimes read_phases(const JsonObject& o) {
  PhaseTimes p;
  // Zero up to floating-point rounding (e.g. -1e-19 s) reads as 0; more negative is an error.
  auto s = [&](const char* k) { return std::max(0.0, o.number(k, -1e-9, kInf)); };
  p.forward = s("forward_s");
  p.backward = s("backward_s");
  p.recompute = s("recompute_s");
  p.tp_comm = s("tp_comm_s");
  p.cp_comm = s("cp_comm_s");
  p.pp_comm = s("pp_comm_s");
  p.dp_comm = s("dp_comm_s");
  p.dp_comm_exposed = s("dp_comm_exposed_s");
  p.bubble = s("bubble_s");
  p.optimizer = s("optimizer_s");
  p.other = s("other_s");
  check_consistent(o, "compute_s", s("compute_s"), p.compute(), "must equal forward_s + backward_s");
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
  if (!m.requested_dtype.empty()) out["run"]["requested_dtype"] = m.requested_dtype;
  return out;
}

Measurement measurement_from_json(const json& j, const std::string& file) {
  JsonObject root(j, file);
  const std::string schema = root.string("schema");
  if (schema != kMeasurementSchema) {
    throw root.error("schema", fmt::format("must be \"{}\" (is this a measurement file?)", kMeasurementSchema));
  }
  // Files written before "status" existed are successful runs.
  const std::string status = root.optional_string("status").value_or("ok");
  if (status == "failed") {
    std::string what = "the run failed";
    if (j.contains("failure") && j["failure"].is_object() && j["failure"].value("error", json()).is_string())
      what += ": " + j["failure"]["error"].get<std::string>();
    throw root.error("status", fmt::format("is \"failed\" ({}); a failed run has no figures to read", what));
  }
  if (status != "ok") throw root.error("status", "must be \"ok\" or \"failed\"");
  Measurement m;
  m.strategy = strategy_from_json(root.raw("strategy"), file);
  m.model = root.string("model");
  m.cluster = root.string("cluster");
  if (root.has("software")) m.software = root.string("software");

  {
    JsonObject run = root.object("run");
    m.backend = run.choice("backend", {"nccl", "gloo"});
    m.device = run.choice("device", {"cuda", "cpu"});
    m.warmup = static_cast<int>(run.integer("warmup_steps", 0, 1 << 24));
    m.steps = static_cast<int>(run.integer("measured_steps", 1, 1 << 24));
    m.seed = run.integer("seed", std::numeric_limits<long long>::min(), std::numeric_limits<long long>::max());
    if (run.has("requested_dtype")) {
      m.requested_dtype = run.string("requested_dtype");
      if (!parse_dtype(m.requested_dtype)) throw run.error("requested_dtype", "must be one of bf16|fp16|fp8|fp32");
    }
    run.finish();
  }

  const json& env = root.raw("environment");
  if (!env.is_object()) throw root.error("environment", "must be a JSON object");
  m.environment = env;

  for (const JsonObject& s : root.objects("steps", 1)) {
    StepRecord r;
    r.step = static_cast<int>(s.integer("step", 0, 1 << 30));
    r.wall = s.number("wall_s", kMinMeasuredStep, kInf);
    r.loss = s.number("loss", 0, kInf);  // cross-entropy: never negative
    JsonObject ph = s.object("phases");
    r.phases = read_phases(ph);
    ph.finish();
    s.finish();
    m.per_step.push_back(r);
  }
  if (static_cast<int>(m.per_step.size()) != m.steps) {
    throw root.error("steps", fmt::format("must hold run.measured_steps = {} entries", m.steps));
  }

  {
    JsonObject st = root.object("step_time");
    m.step_time.median = st.number("median_s", kMinMeasuredStep, kInf);
    m.step_time.mean = st.number("mean_s", kMinMeasuredStep, kInf);
    m.step_time.stdev = st.number("stdev_s", 0, kInf);
    m.step_time.min = st.number("min_s", kMinMeasuredStep, kInf);
    m.step_time.max = st.number("max_s", kMinMeasuredStep, kInf);
    m.step_time.count = static_cast<int>(st.integer("count", 1, 1 << 30));
    if (m.step_time.min > m.step_time.median || m.step_time.median > m.step_time.max) {
      throw st.error("median_s", "must lie between min_s and max_s");
    }
    st.finish();
  }

  {
    JsonObject t = root.object("time");
    m.breakdown = read_phases(t);
    check_consistent(t, "step_s", t.number("step_s", kMinMeasuredStep, kInf), m.step_time.median,
                     "must equal step_time.median_s");
    t.finish();
  }

  {
    JsonObject mem = root.object("memory");
    m.peak_memory = mem.number("peak_bytes", 0, kInf);
    for (const JsonObject& s : mem.objects("per_stage")) {
      StagePeak p;
      p.stage = static_cast<int>(s.integer("stage", 0, 1 << 24));
      p.peak = s.number("peak_bytes", 0, kInf);
      s.finish();
      m.per_stage.push_back(p);
    }
    for (const JsonObject& r : mem.objects("per_rank")) {
      RankMeasurement rm;
      rm.rank = static_cast<int>(r.integer("rank", 0, 1 << 24));
      rm.coords = read_coords(r.object("coords"));
      rm.peak_allocated = r.number("peak_allocated_bytes", 0, kInf);
      rm.peak_reserved = r.number("peak_reserved_bytes", 0, kInf);
      rm.max_rss = r.number("max_rss_bytes", 0, kInf);
      rm.dp_bytes_sent = r.optional_number("dp_bytes_sent_per_step", 0, kInf).value_or(0);  // absent before issue 11
      check_consistent(r, "peak_bytes", r.number("peak_bytes", 0, kInf), rm.peak_bytes(),
                       "must equal peak_reserved_bytes, or max_rss_bytes when that is 0");
      JsonObject ph = r.object("phases");
      rm.phases = read_phases(ph);
      ph.finish();
      r.finish();
      m.ranks.push_back(rm);
    }
    mem.finish();
  }

  {
    JsonObject t = root.object("throughput");
    m.throughput.tokens_per_s = t.number("tokens_per_s", 0, kInf);
    m.throughput.tokens_per_s_per_gpu = t.number("tokens_per_s_per_gpu", 0, kInf);
    m.throughput.model_flops_per_step = t.number("model_flops_per_step", 0, kInf);
    m.throughput.model_tflops_per_gpu = t.number("model_tflops_per_gpu", 0, kInf);
    t.finish();
  }
  // Derived (the largest per-rank figure); absent in measurements from before issue 11.
  m.dp_bytes_sent = 0;
  for (const RankMeasurement& r : m.ranks) m.dp_bytes_sent = std::max(m.dp_bytes_sent, r.dp_bytes_sent);
  if (const auto b = root.optional_number("dp_bytes_sent_per_step", 0, kInf))
    check_consistent(root, "dp_bytes_sent_per_step", *b, m.dp_bytes_sent, "must equal the largest per_rank figure");
  root.finish();
  return m;
}

}  // namespace trainplan

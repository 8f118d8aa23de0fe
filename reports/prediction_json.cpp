#include "reports/prediction_json.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "reports/infeasible.hpp"
#include "reports/schema_fields.hpp"
#include "sim/search.hpp"
#include "sim/simulate.hpp"

namespace trainplan {

using nlohmann::json;
using schema::kInf;

namespace {

// Sizes a plan can have (sim/strategy.hpp): at most 2^24 GPUs, stages and layers.
constexpr long long kMaxRankCount = 1 << 24;

// --- memory, time, throughput ---

json memory_json(const Estimate& e) {
  json stages = json::array();
  for (std::size_t i = 0; i < e.per_stage.size(); ++i) {
    const StageMemory& m = e.per_stage[i];
    stages.push_back({{"stage", m.stage},
                      {"layers", i < e.stage_layers.size() ? e.stage_layers[i] : 0},
                      {"weights", m.weights},
                      {"gradients", m.gradients},
                      {"optimizer", m.optimizer},
                      {"activations", m.activations},
                      {"other", m.other},
                      {"weight_copies", m.weight_copies},
                      {"temporaries", m.temporaries},
                      {"allocator", m.allocator},
                      {"runtime", m.runtime},
                      {"total", m.total()}});
  }
  return {{"peak_bytes", e.peak_memory}, {"capacity_bytes", e.capacity}, {"per_stage", stages}};
}

StageMemory read_stage_memory(const JsonObject& s, std::vector<int>& stage_layers) {
  StageMemory m;
  m.stage = static_cast<int>(s.integer("stage", 0, kMaxRankCount));
  auto bytes = [&](const char* k) { return s.number(k, 0, kInf); };
  // Written since the allocator-aware memory model; absent (0) in older predictions.
  auto later = [&](const char* k) { return schema::has(s, k) ? bytes(k) : 0.0; };
  m.weights = bytes("weights");
  m.gradients = bytes("gradients");
  m.optimizer = bytes("optimizer");
  m.activations = bytes("activations");
  m.other = bytes("other");
  m.weight_copies = later("weight_copies");
  m.temporaries = later("temporaries");
  m.allocator = later("allocator");
  m.runtime = later("runtime");
  schema::check_consistent(s, "total", bytes("total"), m.total(),
                           "must equal weights + gradients + optimizer + activations + other + weight_copies + "
                           "temporaries + allocator + runtime");
  if (schema::has(s, "layers")) stage_layers.push_back(static_cast<int>(s.integer("layers", 0, kMaxRankCount)));
  s.finish();
  return m;
}

// One entry per pipeline stage of the strategy, in order, the peak the largest total; none only in
// an infeasible plan whose memory was never costed (a dtype the GPU lacks), whose peak is then 0.
void read_memory(const JsonObject& mem, Estimate& e) {
  e.peak_memory = mem.number("peak_bytes", 0, kInf);
  e.capacity = mem.number("capacity_bytes", 0, kInf);
  const std::vector<JsonObject> stages = mem.objects("per_stage");
  const int pp = e.strategy.pp;
  if (!stages.empty()) schema::check_stage_count(mem, "per_stage", stages.size(), pp);
  if (stages.empty() && e.feasible) {
    throw mem.error("per_stage", fmt::format("is empty, must have one entry per pipeline stage (strategy.pp = {})", pp));
  }
  double largest = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    e.per_stage.push_back(read_stage_memory(stages[i], e.stage_layers));
    schema::check_stage_index(stages[i], e.per_stage.back().stage, i);
    largest = std::max(largest, e.per_stage.back().total());
  }
  schema::check_consistent(mem, "peak_bytes", e.peak_memory, largest, "must equal the largest per_stage total");
  mem.finish();
}

json time_json(const TimeBreakdown& t) {
  json j = {{"step_s", t.step},         {"compute_s", t.compute},     {"recompute_s", t.recompute},
            {"tp_comm_s", t.tp_comm},   {"cp_comm_s", t.cp_comm},     {"pp_comm_s", t.pp_comm},
            {"dp_comm_s", t.dp_comm},   {"dp_comm_exposed_s", t.dp_comm_exposed},
            {"bubble_s", t.bubble},     {"optimizer_s", t.optimizer}};
  if (t.ep_comm > 0) j["ep_comm_s"] = t.ep_comm;  // plans with experts (older files have none)
  return j;
}

TimeBreakdown read_time(const JsonObject& o) {
  auto sec = [&](const char* k) { return schema::seconds(o, k); };
  TimeBreakdown t;
  t.step = sec("step_s");
  t.compute = sec("compute_s");
  t.recompute = sec("recompute_s");
  t.tp_comm = sec("tp_comm_s");
  t.cp_comm = sec("cp_comm_s");
  if (schema::has(o, "ep_comm_s")) t.ep_comm = sec("ep_comm_s");
  t.pp_comm = sec("pp_comm_s");
  t.dp_comm = sec("dp_comm_s");
  t.dp_comm_exposed = sec("dp_comm_exposed_s");
  t.bubble = sec("bubble_s");
  t.optimizer = sec("optimizer_s");
  o.finish();
  return t;
}

json throughput_json(const Throughput& p) {
  return {{"tokens_per_s", p.tokens_per_s},
          {"tokens_per_s_per_gpu", p.tokens_per_s_per_gpu},
          {"model_flops_per_step", p.model_flops_per_step},
          {"model_flops_per_step_full_attention", p.model_flops_per_step_full_attention},
          {"hardware_flops_per_step", p.hardware_flops_per_step},
          {"model_tflops_per_gpu", p.model_tflops_per_gpu},
          {"hardware_tflops_per_gpu", p.hardware_tflops_per_gpu},
          {"mfu", p.mfu},
          {"mfu_full_attention", p.mfu_full_attention},
          {"hfu", p.hfu}};
}

Throughput read_predicted_throughput(const JsonObject& o) {
  auto num = [&](const char* k) { return o.number(k, 0, kInf); };
  Throughput p;
  p.tokens_per_s = num("tokens_per_s");
  p.tokens_per_s_per_gpu = num("tokens_per_s_per_gpu");
  p.model_flops_per_step = num("model_flops_per_step");
  p.hardware_flops_per_step = num("hardware_flops_per_step");
  p.model_tflops_per_gpu = num("model_tflops_per_gpu");
  p.hardware_tflops_per_gpu = num("hardware_tflops_per_gpu");
  p.mfu = num("mfu");
  p.hfu = num("hfu");
  // Absent from predictions written before both conventions were reported (read as 0).
  p.model_flops_per_step_full_attention = o.optional_number("model_flops_per_step_full_attention", 0, kInf).value_or(0);
  p.mfu_full_attention = o.optional_number("mfu_full_attention", 0, kInf).value_or(0);
  o.finish();
  return p;
}

ParamServerFigures read_parameter_server(const JsonObject& o) {
  ParamServerFigures ps;
  ps.workers = static_cast<int>(o.integer("workers", 0, kMaxRankCount));
  ps.staleness = o.number("staleness_updates", 0, kInf);
  ps.updates_per_s = o.number("updates_per_s", 0, kInf);
  o.finish();
  return ps;
}

// --- cost ---

json cost_json(const PredictionCost& c) {
  if (!c.priced) return nullptr;
  return {{"usd_per_step", c.usd_per_step},
          {"price_per_gpu_hour_usd", c.price_per_gpu_hour_usd},
          {"gpus", c.gpus},
          {"price_source", c.price_source}};
}

PredictionCost read_cost(const JsonObject& root) {
  PredictionCost c;
  if (root.raw("cost").is_null()) return c;
  const JsonObject o = root.object("cost");
  c.priced = true;
  c.usd_per_step = o.number("usd_per_step", 0, kInf);
  c.price_per_gpu_hour_usd = o.number("price_per_gpu_hour_usd", 0, kInf, true);
  c.gpus = static_cast<int>(o.integer("gpus", 1, kMaxRankCount));
  c.price_source = o.string("price_source");
  o.finish();
  return c;
}

// --- layers (predict --detail layers) ---

constexpr const char* kLayersNote =
    "times per micro-batch on one rank; a 'layers' row gives the figures of each of its count layers; bytes per "
    "rank, activations as held at the stage's peak";

const char* part_name(LayerRow::Kind k) {
  return k == LayerRow::Kind::embedding ? "embedding" : k == LayerRow::Kind::head ? "head" : "layers";
}

json layer_row_json(const LayerRow& r) {
  json row = {{"part", part_name(r.kind)},   {"chunk", r.chunk},         {"count", r.count},
              {"forward_s", r.forward},      {"backward_s", r.backward}, {"recompute_s", r.recompute},
              {"tp_comm_s", r.tp_comm},      {"cp_comm_s", r.cp_comm},   {"params", r.params},
              {"weights", r.weights},        {"gradients", r.gradients}, {"optimizer", r.optimizer},
              {"weight_copies", r.weight_copies}, {"activations", r.activations}};
  if (r.kind == LayerRow::Kind::layers) row["first_layer"] = r.first_layer;
  if (r.ep_comm > 0) row["ep_comm_s"] = r.ep_comm;
  if (r.kind == LayerRow::Kind::layers && r.layer_kind != LayerKind{}) row["kind"] = to_string(r.layer_kind);
  if (r.kind == LayerRow::Kind::layers && r.chunk_layers > r.count) row["chunk_layers"] = r.chunk_layers;
  if (r.kind == LayerRow::Kind::head && r.mtp_layers > 0) row["mtp_layers"] = r.mtp_layers;
  return row;
}

// The spellings of LayerKind (to_string): "dense", "moe sliding", ...
LayerKind read_layer_kind(const JsonObject& o) {
  const std::string name = o.choice("kind", {"dense", "dense sliding", "dense chunked", "moe", "moe sliding", "moe chunked"});
  for (bool moe : {false, true})
    for (AttentionWindow w : {AttentionWindow::full, AttentionWindow::sliding, AttentionWindow::chunked})
      if (name == to_string(LayerKind{moe, w})) return {moe, w};
  return {};
}

LayerRow read_layer_row(const JsonObject& o) {
  LayerRow r;
  const std::string part = o.choice("part", {"embedding", "layers", "head"});
  r.kind = part == "embedding" ? LayerRow::Kind::embedding : part == "head" ? LayerRow::Kind::head : LayerRow::Kind::layers;
  r.chunk = static_cast<int>(o.integer("chunk", 0, kMaxRankCount));
  r.count = static_cast<int>(o.integer("count", 1, kMaxRankCount));
  if (r.kind == LayerRow::Kind::layers) r.first_layer = static_cast<int>(o.integer("first_layer", 0, kMaxRankCount));
  auto sec = [&](const char* k) { return schema::seconds(o, k); };
  auto num = [&](const char* k) { return o.number(k, 0, kInf); };
  r.forward = sec("forward_s");
  r.backward = sec("backward_s");
  r.recompute = sec("recompute_s");
  r.tp_comm = sec("tp_comm_s");
  r.cp_comm = sec("cp_comm_s");
  if (schema::has(o, "ep_comm_s")) r.ep_comm = sec("ep_comm_s");
  if (r.kind == LayerRow::Kind::layers && schema::has(o, "kind")) r.layer_kind = read_layer_kind(o);
  r.chunk_layers = r.count;
  if (r.kind == LayerRow::Kind::head && schema::has(o, "mtp_layers"))
    r.mtp_layers = static_cast<int>(o.integer("mtp_layers", 1, 16));
  if (r.kind == LayerRow::Kind::layers && schema::has(o, "chunk_layers"))
    r.chunk_layers = static_cast<int>(o.integer("chunk_layers", r.count, kMaxRankCount));
  r.params = num("params");
  r.weights = num("weights");
  r.gradients = num("gradients");
  r.optimizer = num("optimizer");
  r.weight_copies = num("weight_copies");
  r.activations = num("activations");
  o.finish();
  return r;
}

StageDetail read_stage_detail(const JsonObject& o) {
  StageDetail d;
  d.stage = static_cast<int>(o.integer("stage", 0, kMaxRankCount));
  d.chunks_in_flight = static_cast<int>(o.integer("chunks_in_flight", 0, 1LL << 40));
  d.working_layer = o.number("recompute_working_bytes", 0, kInf);
  for (const JsonObject& r : o.objects("rows")) d.rows.push_back(read_layer_row(r));
  const JsonObject t = o.object("total");
  d.forward = schema::seconds(t, "forward_s");
  d.backward = schema::seconds(t, "backward_s");
  d.recompute = schema::seconds(t, "recompute_s");
  d.tp_comm = schema::seconds(t, "tp_comm_s");
  d.cp_comm = schema::seconds(t, "cp_comm_s");
  if (schema::has(t, "ep_comm_s")) d.ep_comm = schema::seconds(t, "ep_comm_s");
  t.finish();
  o.finish();
  return d;
}

std::vector<StageDetail> read_layers(const JsonObject& o) {
  (void)schema::text(o, "note");
  std::vector<StageDetail> out;
  for (const JsonObject& s : o.objects("stages")) out.push_back(read_stage_detail(s));
  o.finish();
  return out;
}

// --- parameter counts (models with experts or MTP modules) ---

json parameters_json(const ParamCounts& c) {
  return {{"total", c.total}, {"active", c.active}, {"embedding", c.embedding}, {"expert", c.expert}, {"mtp", c.mtp}};
}

ParamCounts read_parameters(const JsonObject& o) {
  ParamCounts c;
  c.total = o.number("total", 0, kInf);
  c.active = o.number("active", 0, c.total);
  c.embedding = o.number("embedding", 0, c.total);
  c.expert = o.number("expert", 0, c.total);
  c.mtp = o.number("mtp", 0, kInf);
  o.finish();
  return c;
}

// --- the document ---

// A simulation is of the document's layout: one entry per pipeline stage, in order, each holding
// that stage's ranks in the first data-parallel replica (replica_stage_ranks, the rank layout's),
// in the summary and in the timeline alike; its step is the time section's.
void check_simulation_layout(const JsonObject& root, const SimulationDoc& sim, const Estimate& e) {
  const JsonObject o = root.object("simulation");
  const int pp = e.strategy.pp;
  schema::check_stage_count(o, "stages", sim.stages.size(), pp);
  if (sim.timeline) schema::check_stage_count(o.object("timeline"), "stages", sim.timeline->size(), pp);
  // Counted first: the rank layout is built for as many stages as the file lists, never more.
  const std::vector<std::vector<int>> ranks = replica_stage_ranks(e.strategy);
  auto check_stages = [&](const JsonObject& section, const auto& stages) {
    const std::vector<JsonObject> entries = section.objects("stages");
    for (std::size_t i = 0; i < stages.size(); ++i) {
      schema::check_stage_index(entries[i], stages[i].stage, i);
      if (stages[i].ranks != ranks[i]) {
        throw entries[i].error("ranks", fmt::format("must be [{}], stage {}'s ranks in the first data-parallel replica "
                                                    "of the strategy",
                                                    fmt::join(ranks[i], ","), i));
      }
    }
  };
  check_stages(o, sim.stages);
  if (sim.timeline) check_stages(o.object("timeline"), *sim.timeline);
  schema::check_consistent(o, "step_s", sim.step, e.time.step, "must equal time.step_s (the step simulated)");
}

// The keys beside the figures: names, engine, cost, layer detail, simulation, search rank.
void read_extras(const JsonObject& root, const json& j, PredictionDoc& d) {
  auto name = [&](const char* k) { return schema::has(root, k) ? root.string(k) : std::string(); };
  d.model = name("model");
  d.model_spec = read_model_spec(root, d.model);
  d.cluster = name("cluster");
  d.software = name("software");
  d.software_executor = name("software_executor");
  if (schema::has(root, "engine")) d.engine = root.choice("engine", {"analytic", "des"});
  if (j.contains("cost")) d.cost = read_cost(root);
  if (schema::has(root, "layers")) d.layers = read_layers(root.object("layers"));
  if (schema::has(root, "parameters")) d.parameters = read_parameters(root.object("parameters"));
  if (schema::has(root, "simulation")) {
    d.simulation = simulation_from_json(root.object("simulation"));
    check_simulation_layout(root, *d.simulation, d.estimate);
  }
  const bool ranked = schema::has(root, "rank");
  if (ranked != schema::has(root, "objective_value")) {
    throw root.error(ranked ? "rank" : "objective_value", "must come with rank and objective_value both");
  }
  if (ranked) {
    d.rank = root.integer("rank", 1, 1LL << 40);
    d.objective_value = root.number("objective_value", 0, kInf);
  }
}

}  // namespace

PredictionDoc prediction_doc(const Estimate& e) {
  PredictionDoc d;
  d.estimate = e;
  d.infeasible_reasons = infeasible_reasons(e);
  return d;
}

json prediction_to_json(const PredictionDoc& d) {
  const Estimate& e = d.estimate;
  json j = {{"schema", kPredictionSchema},
            {"feasible", e.feasible},
            {"infeasible_reasons", d.infeasible_reasons},
            {"strategy", to_json(e.strategy)},
            {"memory", memory_json(e)},
            {"time", time_json(e.time)},
            {"throughput", throughput_json(e.throughput)}};
  // Parameter-server figures only where servers are used (default outputs keep their keys).
  if (e.strategy.uses_ps()) {
    j["parameter_server"] = {
        {"workers", e.ps.workers}, {"staleness_updates", e.ps.staleness}, {"updates_per_s", e.ps.updates_per_s}};
  }
  if (!d.model.empty()) j["model"] = d.model;
  if (d.model_spec) j["model_spec"] = to_json(*d.model_spec);
  if (!d.cluster.empty()) j["cluster"] = d.cluster;
  if (!d.software.empty()) j["software"] = d.software;
  if (!d.software_executor.empty()) j["software_executor"] = d.software_executor;
  if (!d.engine.empty()) j["engine"] = d.engine;
  if (d.cost) j["cost"] = cost_json(*d.cost);
  if (d.parameters) j["parameters"] = parameters_json(*d.parameters);
  if (d.layers) j["layers"] = layer_detail_to_json(*d.layers);
  if (d.simulation) j["simulation"] = simulation_to_json(*d.simulation);
  if (d.rank) j["rank"] = *d.rank;
  if (d.objective_value) j["objective_value"] = *d.objective_value;
  return j;
}

PredictionDoc prediction_from_json(const json& j, const std::string& file) {
  const JsonObject root(j, file);
  schema::check_schema(root, kPredictionSchema, "is this a prediction file?");
  PredictionDoc d;
  Estimate& e = d.estimate;
  e.feasible = root.boolean("feasible");
  d.infeasible_reasons = schema::texts(root, "infeasible_reasons");
  if (e.feasible != d.infeasible_reasons.empty()) {
    throw root.error("infeasible_reasons", e.feasible ? "must be empty for a feasible plan"
                                                      : "must name at least one reason for an infeasible plan");
  }
  e.strategy = strategy_from_json(root.raw("strategy"), file);
  read_memory(root.object("memory"), e);
  e.time = read_time(root.object("time"));
  e.throughput = read_predicted_throughput(root.object("throughput"));
  if (e.strategy.uses_ps()) e.ps = read_parameter_server(root.object("parameter_server"));
  read_extras(root, j, d);
  root.finish();
  return d;
}

std::optional<ModelSpec> read_model_spec(const JsonObject& root, const std::string& name) {
  if (!schema::has(root, "model_spec")) return std::nullopt;
  (void)root.object("model_spec");  // an object, or a message naming the key
  ModelSpec m = parse_model(root.raw("model_spec"), schema::nested(root, "model_spec"));
  if (!name.empty() && name != m.name) throw root.error("model", fmt::format("must be model_spec.name ({})", json(m.name).dump()));
  return m;
}

PredictionCost prediction_cost(const Estimate& e, const Cluster& cluster) {
  PredictionCost c;
  if (cluster.price_per_gpu_hour <= 0 || !(e.time.step > 0)) return c;
  c.priced = true;
  c.usd_per_step = objective_value(Objective::cost, e, cluster);
  c.price_per_gpu_hour_usd = cluster.price_per_gpu_hour;
  c.gpus = e.strategy.gpus();
  c.price_source = "price_per_gpu_hour_usd of cluster file " + cluster.name;
  return c;
}

json cost_to_json(const Estimate& e, const Cluster& cluster) { return cost_json(prediction_cost(e, cluster)); }

json layer_detail_to_json(const std::vector<StageDetail>& stages) {
  json out = json::array();
  for (const StageDetail& d : stages) {
    json rows = json::array();
    for (const LayerRow& r : d.rows) rows.push_back(layer_row_json(r));
    json total = {{"forward_s", d.forward},
                  {"backward_s", d.backward},
                  {"recompute_s", d.recompute},
                  {"tp_comm_s", d.tp_comm},
                  {"cp_comm_s", d.cp_comm}};
    if (d.ep_comm > 0) total["ep_comm_s"] = d.ep_comm;
    out.push_back({{"stage", d.stage},
                   {"chunks_in_flight", d.chunks_in_flight},
                   {"recompute_working_bytes", d.working_layer},
                   {"rows", rows},
                   {"total", total}});
  }
  return {{"note", kLayersNote}, {"stages", out}};
}

}  // namespace trainplan

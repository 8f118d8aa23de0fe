#include "reports/search_json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "reports/infeasible.hpp"
#include "reports/schema_fields.hpp"
#include "reports/svg.hpp"
#include "reports/thin.hpp"

namespace trainplan {

using nlohmann::json;
using schema::kInf;

namespace {

// Counts of a search (at most the layouts of 2^24 GPUs times every option: far below 2^62).
constexpr long long kMaxCount = 1LL << 62;
constexpr long long kMaxSize = 1 << 24;  // GPUs, sizes and limits of a plan (sim/strategy.hpp)

// The objective value as the user reads it (throughput is ranked as minus tokens/s).
double shown_value(Objective o, double v) { return o == Objective::throughput ? -v : v; }

PredictionDoc entry(const Estimate& e, const SearchContext& ctx, const char* engine) {
  PredictionDoc d = prediction_doc(e);
  d.model = ctx.model;
  d.cluster = ctx.cluster;
  d.engine = engine;
  return d;
}

// The feasible candidates' (step, peak memory) for the report's scatter plot, thinned to at most
// the points a chart draws (kMaxDrawnPoints; svg::thin_points: the front kept whole, dominated
// points one per grid cell).
SearchCandidates candidates_of(const std::vector<std::pair<Seconds, Bytes>>& points) {
  const std::vector<std::size_t> kept = svg::thin_points(points, kMaxDrawnPoints);
  SearchCandidates c;
  c.feasible = static_cast<std::int64_t>(points.size());
  c.thinned = kept.size() < points.size();
  for (std::size_t i : kept) c.points.push_back(points[i]);
  return c;
}

json candidates_json(const SearchCandidates& c) {
  json step = json::array(), bytes = json::array();
  for (const auto& [s, b] : c.points) {
    step.push_back(s);
    bytes.push_back(b);
  }
  return {{"feasible", c.feasible}, {"thinned", c.thinned}, {"step_s", step}, {"peak_bytes", bytes}};
}

SearchCandidates read_candidates(const JsonObject& o) {
  SearchCandidates c;
  c.feasible = o.integer("feasible", 0, kMaxCount);
  c.thinned = o.boolean("thinned");
  const std::vector<double> step = schema::numbers(o, "step_s", 0, kInf, true);
  const std::vector<double> bytes = schema::numbers(o, "peak_bytes", 0, kInf);
  if (step.size() != bytes.size()) throw o.error("peak_bytes", "must have as many entries as step_s");
  if (static_cast<long long>(step.size()) > c.feasible) throw o.error("step_s", "must have at most \"feasible\" entries");
  for (std::size_t i = 0; i < step.size(); ++i) c.points.emplace_back(step[i], bytes[i]);
  o.finish();
  return c;
}

// --- the search space ---

json space_json(const SearchSpace& sp) {
  json lists = {{"zero", sp.zero_stages}, {"recompute", json::array()}, {"schedules", json::array()},
                {"sequence_parallel", json::array()}};
  for (Recompute x : sp.recompute) lists["recompute"].push_back(to_string(x));
  for (ScheduleKind x : sp.schedules) lists["schedules"].push_back(to_string(x));
  for (bool x : sp.sequence_parallel) lists["sequence_parallel"].push_back(x);
  // The DP-algorithm and compression lists only where the search opted in (default outputs keep
  // their keys).
  const bool default_dp = sp.dp_algorithms == std::vector<DpAlgorithm>{DpAlgorithm::allreduce} &&
                          sp.grad_compressions == std::vector<GradCompression>{GradCompression{}};
  if (!default_dp) {
    lists["dp_algorithms"] = json::array();
    for (DpAlgorithm a : sp.dp_algorithms) lists["dp_algorithms"].push_back(to_string(a));
    lists["grad_compressions"] = json::array();
    for (const GradCompression& g : sp.grad_compressions) lists["grad_compressions"].push_back(to_string(g));
    lists["ps_servers"] = sp.ps_servers;
    lists["ps_placement"] = to_string(sp.ps_placement);
  }
  json out = {{"gpus", sp.gpus},
          {"exact_gpus", sp.exact_gpus},
          {"global_batch", sp.global_batch},
          {"seq_len", sp.seq_len},
          {"dtype", to_string(sp.dtype)},
          {"attention", to_string(sp.attention)},
          {"max_tp", sp.max_tp},
          {"max_pp", sp.max_pp},
          {"max_cp", sp.max_cp},
          {"max_dp", sp.max_dp},
          {"max_vp", sp.max_vp},
          {"max_micro_batch", sp.max_micro_batch},
          {"lists", lists}};
  if (sp.cuda_graphs != CudaGraphs::none) out["cuda_graphs"] = to_string(sp.cuda_graphs);  // older files keep their bytes
  if (sp.cuda_graph_modules != 0) out["cuda_graph_modules"] = cuda_graph_modules_string(sp.cuda_graph_modules);
  // The expert part only where it differs from the defaults (dense searches keep their keys).
  const ExpertSpace& x = sp.experts;
  if (!(x == ExpertSpace{})) {
    json etp = json::array();
    if (x.etp_one) etp.push_back("1");
    if (x.etp_tp) etp.push_back("tp");
    out["experts"] = {{"max_ep", x.max_ep},
                      {"etp", etp},
                      {"moe_imbalance", x.moe_imbalance},
                      {"capacity_factor", x.capacity_factor},
                      {"moe_dispatcher", to_string(x.dispatcher)},
                      {"moe_a2a_overlap", x.moe_a2a_overlap},
                      {"recompute_modules", x.recompute_modules ? recompute_modules_string(x.recompute_modules) : "none"}};
  }
  return out;
}


// A list of names, each through `parse` (nullopt: not one of `allowed`).
template <class T, class Parse>
std::vector<T> parsed_list(const JsonObject& o, const char* key, Parse parse, const char* allowed) {
  std::vector<T> out;
  const std::vector<std::string> items = schema::texts(o, key);
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto v = parse(items[i]);
    if (!v) throw InputError(fmt::format("{}: {}[{}] = \"{}\", must be one of {}", o.file(), o.field(key), i, items[i], allowed));
    out.push_back(*v);
  }
  return out;
}

ExpertSpace read_expert_space(const JsonObject& o) {
  ExpertSpace x;
  x.max_ep = static_cast<int>(o.integer("max_ep", 0, 1 << 16));  // 0: no limit
  const std::vector<std::string> etp = parsed_list<std::string>(
      o, "etp", [](const std::string& v) { return v == "1" || v == "tp" ? std::optional(v) : std::nullopt; }, "1|tp");
  x.etp_one = std::find(etp.begin(), etp.end(), "1") != etp.end();
  x.etp_tp = std::find(etp.begin(), etp.end(), "tp") != etp.end();
  x.moe_imbalance = o.number("moe_imbalance", 1, 1 << 16);
  x.capacity_factor = o.number("capacity_factor", 0, 1 << 16);
  x.dispatcher = *parse_dispatcher(o.choice("moe_dispatcher", {"alltoall", "allgather", "flex"}));
  x.moe_a2a_overlap = o.boolean("moe_a2a_overlap");
  const auto modules = parse_recompute_modules(o.string("recompute_modules"));
  if (!modules) throw o.error("recompute_modules", "must be none or a comma-separated list of moe_act, mla_up_proj, layernorm, mlp");
  x.recompute_modules = *modules;
  o.finish();
  return x;
}

void read_lists(const JsonObject& l, SearchSpace& sp) {
  sp.zero_stages.clear();
  for (long long z : schema::integers(l, "zero", 0, 3)) sp.zero_stages.push_back(static_cast<int>(z));
  sp.recompute = parsed_list<Recompute>(l, "recompute", parse_recompute, "none|selective|full");
  sp.schedules = parsed_list<ScheduleKind>(l, "schedules", parse_schedule, "gpipe|1f1b|interleaved");
  sp.sequence_parallel = schema::booleans(l, "sequence_parallel");
  if (schema::has(l, "dp_algorithms")) {
    sp.dp_algorithms = parsed_list<DpAlgorithm>(l, "dp_algorithms", parse_dp_algorithm, "allreduce|ps|ps-async");
    sp.grad_compressions =
        parsed_list<GradCompression>(l, "grad_compressions", parse_grad_compression, "none|bf16|powersgd:R");
    sp.ps_servers = static_cast<int>(l.integer("ps_servers", 1, 1 << 20));
    sp.ps_placement = *parse_ps_placement(l.choice("ps_placement", {"dedicated", "colocated"}));
  }
  l.finish();
}

SearchSpace read_space(const JsonObject& o) {
  SearchSpace sp;
  sp.gpus = static_cast<int>(o.integer("gpus", 1, kMaxSize));
  sp.exact_gpus = o.boolean("exact_gpus");
  sp.global_batch = static_cast<int>(o.integer("global_batch", 1, 1 << 30));
  sp.seq_len = static_cast<int>(o.integer("seq_len", 1, kMaxSize));
  sp.dtype = *parse_dtype(o.choice("dtype", {"bf16", "fp16", "fp8", "fp32", "mxfp8", "nvfp4"}));
  sp.attention = *parse_attention(o.choice("attention", {"flash", "standard"}));
  auto limit = [&](const char* k) { return static_cast<int>(o.integer(k, 0, kMaxSize)); };  // 0: no limit
  sp.max_tp = limit("max_tp");
  sp.max_pp = limit("max_pp");
  sp.max_cp = limit("max_cp");
  sp.max_dp = limit("max_dp");
  sp.max_vp = limit("max_vp");
  sp.max_micro_batch = limit("max_micro_batch");
  read_lists(o.object("lists"), sp);
  if (o.has("cuda_graphs")) sp.cuda_graphs = *parse_cuda_graphs(o.choice("cuda_graphs", {"none", "full"}));
  if (auto g = o.optional_string("cuda_graph_modules")) {
    auto parsed = parse_cuda_graph_modules(*g);
    if (!parsed)
      throw o.error("cuda_graph_modules",
                    "must list attn, mlp, moe, moe_router, moe_preprocess (comma-separated) or be none");
    sp.cuda_graph_modules = *parsed;
  }
  if (o.has("experts")) sp.experts = read_expert_space(o.object("experts"));
  o.finish();
  return sp;
}

// --- the lists of predictions ---

// Each entry of `key` a prediction; `ranked`: the top list, whose entries carry rank i + 1 and an
// objective value (the other lists carry neither).
std::vector<PredictionDoc> read_entries(const JsonObject& root, const char* key, bool ranked) {
  const json& a = schema::array(root, key);
  std::vector<PredictionDoc> out;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string name = schema::nested(root, key, i);
    PredictionDoc d = prediction_from_json(a[i], name);
    if (ranked && d.rank != static_cast<long long>(i + 1)) {
      throw InputError(fmt::format("{}: rank must be {} (the entry's place in the list)", name, i + 1));
    }
    if (!ranked && d.rank) throw InputError(fmt::format("{}: rank is not a key of this list (only top is ranked)", name));
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

const char* objective_unit(Objective o) {
  switch (o) {
    case Objective::throughput: return "tokens/s";
    case Objective::cost: return "USD/step";
    case Objective::time: return "s/step";
  }
  return "";
}

json search_stats_to_json(const SearchStats& st) {
  json j = {{"candidates", st.candidates},
            {"evaluated", st.evaluated},
            {"feasible", st.feasible},
            {"infeasible_by_reason", counts_by_key(st.infeasible_by_reason)},
            {"pruned_out_of_memory", st.pruned_out_of_memory},
            {"pruned_by_bound", st.pruned_by_bound},
            {"layouts", st.layouts},
            {"max_gpus_considered", st.max_gpus_considered},
            {"elapsed_s", st.elapsed_s},
            {"threads", st.threads},
            {"top_refined_with_simulation", st.refined}};
  if (st.least_memory_floor > 0) j["least_memory_floor_bytes"] = st.least_memory_floor;
  return j;
}

SearchStats search_stats_from_json(const JsonObject& o) {
  SearchStats st;
  st.candidates = o.integer("candidates", 0, kMaxCount);
  st.evaluated = o.integer("evaluated", 0, kMaxCount);
  st.feasible = o.integer("feasible", 0, kMaxCount);
  const JsonObject reasons = o.object("infeasible_by_reason");
  for (const std::string& k : reasons.keys()) {
    const auto reason = parse_reason_key(k);
    if (!reason) throw reasons.error(k, "is not a reason (invalid, unsupported dtype, cluster too small, out of memory)");
    st.infeasible_by_reason[*reason] = reasons.integer(k, 0, kMaxCount);
  }
  st.pruned_out_of_memory = o.integer("pruned_out_of_memory", 0, kMaxCount);
  if (schema::has(o, "least_memory_floor_bytes")) st.least_memory_floor = o.number("least_memory_floor_bytes", 0, kInf);
  st.pruned_by_bound = o.integer("pruned_by_bound", 0, kMaxCount);
  st.layouts = static_cast<int>(o.integer("layouts", 0, (1LL << 31) - 1));
  st.max_gpus_considered = static_cast<int>(o.integer("max_gpus_considered", 0, kMaxSize));
  st.elapsed_s = o.number("elapsed_s", 0, kInf);
  st.threads = static_cast<int>(o.integer("threads", 0, 1 << 20));
  // Written since the top list is refined with the step simulator; absent (0) before.
  if (schema::has(o, "top_refined_with_simulation")) {
    st.refined = static_cast<int>(o.integer("top_refined_with_simulation", 0, 1 << 30));
  }
  o.finish();
  return st;
}

SearchDoc search_doc(const SearchResult& r, const SearchContext& ctx) {
  SearchDoc d;
  d.model = ctx.model;
  d.cluster = ctx.cluster;
  if (ctx.model_spec) d.model_spec = *ctx.model_spec;
  d.software = ctx.software;
  d.objective = ctx.objective;
  d.space = *ctx.space;
  d.stats = r.stats;
  d.pareto_window = ctx.pareto_window;
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    d.top.push_back(entry(r.top[i], ctx, r.stats.refined > 0 ? "des" : "analytic"));
    d.top.back().rank = static_cast<long long>(i + 1);
    d.top.back().objective_value = shown_value(ctx.objective, r.top_value[i]);
  }
  for (const Estimate& e : r.pareto) d.pareto.push_back(entry(e, ctx, "analytic"));
  for (const Estimate& e : r.infeasible) d.infeasible.push_back(entry(e, ctx, "analytic"));
  if (!r.points.empty()) d.candidates = candidates_of(r.points);
  return d;
}

json search_to_json(const SearchDoc& d) {
  json top = json::array(), pareto = json::array(), infeasible = json::array();
  for (const PredictionDoc& p : d.top) top.push_back(prediction_to_json(p));
  for (const PredictionDoc& p : d.pareto) pareto.push_back(prediction_to_json(p));
  for (const PredictionDoc& p : d.infeasible) infeasible.push_back(prediction_to_json(p));
  json j = {{"schema", kSearchSchema},
            {"model", d.model},
            {"cluster", d.cluster},
            {"objective", to_string(d.objective)},
            {"objective_unit", objective_unit(d.objective)},
            {"space", space_json(d.space)},
            {"search", search_stats_to_json(d.stats)},
            {"pareto_window", d.pareto_window},
            {"top", top},
            {"pareto", pareto},
            {"infeasible", infeasible}};
  if (d.model_spec) j["model_spec"] = to_json(*d.model_spec);
  if (!d.software.empty()) j["software"] = d.software;
  if (d.candidates) j["candidates"] = candidates_json(*d.candidates);
  return j;
}

json search_to_json(const SearchResult& r, const SearchContext& ctx) { return search_to_json(search_doc(r, ctx)); }

SearchDoc search_from_json(const json& j, const std::string& file) {
  const JsonObject root(j, file);
  schema::check_schema(root, kSearchSchema, "is this a search file?");
  SearchDoc d;
  d.model = root.string("model");
  d.model_spec = read_model_spec(root, d.model);
  if (schema::has(root, "software")) d.software = root.string("software");
  d.cluster = root.string("cluster");
  d.objective = *parse_objective(root.choice("objective", {"throughput", "cost", "time"}));
  if (root.string("objective_unit") != objective_unit(d.objective)) {
    throw root.error("objective_unit", fmt::format("must be {} for objective {}", objective_unit(d.objective),
                                                   to_string(d.objective)));
  }
  d.space = read_space(root.object("space"));
  d.stats = search_stats_from_json(root.object("search"));
  d.pareto_window = root.number("pareto_window", 1, kInf);
  d.top = read_entries(root, "top", true);
  d.pareto = read_entries(root, "pareto", false);
  d.infeasible = read_entries(root, "infeasible", false);
  if (schema::has(root, "candidates")) d.candidates = read_candidates(root.object("candidates"));
  root.finish();
  return d;
}

}  // namespace trainplan

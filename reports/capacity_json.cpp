#include "reports/capacity_json.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "reports/prediction_json.hpp"
#include "reports/schema_fields.hpp"
#include "reports/search_json.hpp"

namespace trainplan {

using nlohmann::json;
using schema::kInf;

namespace {

constexpr double kSecondsPerHour = 3600, kSecondsPerMinute = 60;
constexpr long long kMaxGpus = 1 << 24;  // sim/strategy.hpp

// An option's layout as a prediction document: the model's, on the option's cluster.
json best_json(const Estimate& e, const std::string& model, const std::string& cluster) {
  PredictionDoc d = prediction_doc(e);
  d.model = model;
  d.cluster = cluster;
  d.engine = "analytic";
  return prediction_to_json(d);
}

Estimate read_best(const JsonObject& o) {
  return prediction_from_json(o.raw("best"), schema::nested(o, "best")).estimate;
}

// "layout", "tokens_per_s" (and "mfu") repeat figures of "best": they must agree with it.
void check_layout(const JsonObject& o, const Estimate& best) {
  if (o.string("layout") != describe(best.strategy)) {
    throw o.error("layout", fmt::format("must be \"{}\", the layout of best.strategy", describe(best.strategy)));
  }
  schema::check_consistent(o, "tokens_per_s", o.number("tokens_per_s", 0, kInf), best.throughput.tokens_per_s,
                           "must equal best.throughput.tokens_per_s");
}

json failures_json(const CapacityOption& o) {
  const Goodput& g = o.goodput;
  // null: the option never finishes (goodput 0), so it has no time, cost or energy.
  auto finishing = [&](double v) { return g.goodput > 0 ? json(v) : json(nullptr); };
  return {{"job_mtbf_hours", g.job_mtbf / kSecondsPerHour},
          {"checkpoint_bytes", g.checkpoint},
          {"checkpoint_write_s", g.checkpoint_write},
          {"checkpoint_interval_s", g.interval},
          {"checkpoint_interval_steps", g.interval_steps},
          {"restart_s", g.restart},
          {"failures_per_day", g.failures_per_day},
          {"lost_work_hours_per_day", g.lost_work_per_day / kSecondsPerHour},
          {"restart_hours_per_day", g.restart_per_day / kSecondsPerHour},
          {"checkpoint_hours_per_day", g.checkpoint_per_day / kSecondsPerHour},
          {"goodput", g.goodput},
          {"days", finishing(o.days_with_failures)},
          {"gpu_hours", finishing(o.gpu_hours_with_failures)},
          {"cost_usd", finishing(o.cost_usd_with_failures)},
          {"energy_kwh", finishing(o.energy_kwh_with_failures)}};
}

void read_failures(const JsonObject& f, CapacityOption& o) {
  Goodput& g = o.goodput;
  auto num = [&](const char* k) { return f.number(k, 0, kInf); };
  g.job_mtbf = num("job_mtbf_hours") * kSecondsPerHour;
  g.checkpoint = num("checkpoint_bytes");
  g.checkpoint_write = num("checkpoint_write_s");
  g.interval = num("checkpoint_interval_s");
  g.interval_steps = num("checkpoint_interval_steps");
  g.restart = num("restart_s");
  g.failures_per_day = num("failures_per_day");
  g.lost_work_per_day = num("lost_work_hours_per_day") * kSecondsPerHour;
  g.restart_per_day = num("restart_hours_per_day") * kSecondsPerHour;
  g.checkpoint_per_day = num("checkpoint_hours_per_day") * kSecondsPerHour;
  g.goodput = f.number("goodput", 0, 1);
  auto finishing = [&](const char* k) {
    const std::optional<double> v = schema::nullable_number(f, k, 0, kInf);
    if (v.has_value() != (g.goodput > 0)) {
      throw f.error(k, g.goodput > 0 ? "must be a number: the option finishes (goodput > 0)"
                                     : "must be null: with goodput 0 the option never finishes");
    }
    return v.value_or(0);
  };
  o.days_with_failures = finishing("days");
  o.gpu_hours_with_failures = finishing("gpu_hours");
  o.cost_usd_with_failures = finishing("cost_usd");
  o.energy_kwh_with_failures = finishing("energy_kwh");
  o.with_failures = true;
  f.finish();
}

json elastic_json(const ElasticOption& e, const std::string& model, const std::string& cluster) {
  json el = {{"gpus", e.gpus}, {"feasible", e.feasible}};
  if (!e.feasible) {
    el["why"] = e.why;
    return el;
  }
  el["gpus_used"] = e.best.strategy.gpus();
  el["layout"] = describe(e.best.strategy);
  el["tokens_per_s"] = e.best.throughput.tokens_per_s;
  el["throughput_share"] = e.throughput_share;
  el["resume_s"] = e.resume;
  el["best"] = best_json(e.best, model, cluster);
  return el;
}

ElasticOption read_elastic(const JsonObject& o) {
  ElasticOption e;
  e.gpus = static_cast<int>(o.integer("gpus", 0, kMaxGpus));
  e.feasible = o.boolean("feasible");
  if (!e.feasible) {
    e.why = schema::text(o, "why");
    o.finish();
    return e;
  }
  e.best = read_best(o);
  if (o.integer("gpus_used", 1, kMaxGpus) != e.best.strategy.gpus()) {
    throw o.error("gpus_used", "must equal the GPUs of best.strategy");
  }
  check_layout(o, e.best);
  e.throughput_share = o.number("throughput_share", 0, kInf);
  e.resume = o.number("resume_s", 0, kInf);
  o.finish();
  return e;
}

json option_json(const CapacityOption& o, const std::string& model) {
  json j = {{"cluster", o.cluster},
            {"gpus", o.gpus},
            {"feasible", o.feasible},
            {"price_per_gpu_hour_usd", o.price_per_gpu_hour},
            {"price_source", o.price_given ? "--price" : "cluster file"},
            {"power_per_gpu_w", o.power_per_gpu_w},
            {"search", search_stats_to_json(o.stats)}};
  if (!o.feasible) {
    j["why"] = o.why;
    return j;
  }
  j["days"] = o.days;
  j["hours"] = o.hours;
  j["gpu_hours"] = o.gpu_hours;
  j["cost_usd"] = o.cost_usd;
  j["energy_kwh"] = o.energy_kwh;
  j["layout"] = describe(o.best.strategy);
  j["mfu"] = o.best.throughput.mfu;
  j["tokens_per_s"] = o.best.throughput.tokens_per_s;
  j["best"] = best_json(o.best, model, o.cluster);
  if (o.with_failures) j["failures"] = failures_json(o);
  if (o.elastic) j["elastic"] = elastic_json(*o.elastic, model, o.cluster);
  return j;
}

CapacityOption read_option(const JsonObject& j) {
  CapacityOption o;
  o.cluster = j.string("cluster");
  o.gpus = static_cast<int>(j.integer("gpus", 1, kMaxGpus));
  o.feasible = j.boolean("feasible");
  o.price_per_gpu_hour = j.number("price_per_gpu_hour_usd", 0, kInf);
  // Files written before --price existed have no price_source: their prices are the files'.
  o.price_given = schema::has(j, "price_source") && j.choice("price_source", {"cluster file", "--price"}) == "--price";
  o.power_per_gpu_w = j.number("power_per_gpu_w", 0, kInf);
  o.stats = search_stats_from_json(j.object("search"));
  if (!o.feasible) {
    o.why = schema::text(j, "why");
    j.finish();
    return o;
  }
  auto num = [&](const char* k) { return j.number(k, 0, kInf); };
  o.days = num("days");
  o.hours = num("hours");
  o.gpu_hours = num("gpu_hours");
  o.cost_usd = num("cost_usd");
  o.energy_kwh = num("energy_kwh");
  o.best = read_best(j);
  check_layout(j, o.best);
  schema::check_consistent(j, "mfu", num("mfu"), o.best.throughput.mfu, "must equal best.throughput.mfu");
  if (schema::has(j, "failures")) read_failures(j.object("failures"), o);
  if (schema::has(j, "elastic")) o.elastic = read_elastic(j.object("elastic"));
  j.finish();
  return o;
}

json reliability_json(const Reliability& r) {
  return {{"source", r.source},
          {"mtbf_gpu_hours", r.mtbf_gpu_hours},
          {"checkpoint_gbps_per_gpu", r.checkpoint_per_gpu / kGB},
          {"restart_minutes", r.restart / kSecondsPerMinute}};
}

Reliability read_reliability(const JsonObject& o) {
  Reliability r;
  r.source = o.string("source");
  r.mtbf_gpu_hours = o.number("mtbf_gpu_hours", kMtbfHoursMin, kMtbfHoursMax);
  r.checkpoint_per_gpu = o.number("checkpoint_gbps_per_gpu", kCheckpointGbpsMin, kCheckpointGbpsMax) * kGB;
  r.restart = o.number("restart_minutes", 0, kRestartMinutesMax) * kSecondsPerMinute;
  o.finish();
  return r;
}

// An index into the options (null: none), for the deadline and budget picks.
std::optional<std::size_t> read_pick(const JsonObject& root, const char* key, std::size_t options) {
  const auto i = schema::nullable_integer(root, key, 0, static_cast<long long>(options) - 1);
  return i ? std::optional<std::size_t>(static_cast<std::size_t>(*i)) : std::nullopt;
}

void read_context(const JsonObject& root, CapacityContext& c) {
  c.model = root.string("model");
  c.tokens = root.number("tokens", 0, kInf, true);
  c.global_batch = static_cast<int>(root.integer("global_batch", 1, 1 << 30));
  c.seq_len = static_cast<int>(root.integer("seq_len", 1, kMaxGpus));
  c.deadline_days = schema::nullable_number(root, "deadline_days", 0, kInf);
  c.budget_usd = schema::nullable_number(root, "budget_usd", 0, kInf);
}

const char* ranking_rule_key(RankingRule r) {
  switch (r) {
    case RankingRule::cheapest_in_deadline: return "cheapest_within_deadline";
    case RankingRule::fastest_in_budget: return "fastest_within_budget";
    case RankingRule::cheapest: return "cheapest";
  }
  return "?";
}

// "ranking": the rule follows from the deadline and budget asked; one feasible option per cluster.
void read_ranking(const JsonObject& o, CapacityDoc& d) {
  CapacityResult& r = d.result;
  const std::string rule = o.choice("rule", {"cheapest_within_deadline", "fastest_within_budget", "cheapest"});
  r.ranking_rule = d.context.deadline_days ? RankingRule::cheapest_in_deadline
                   : d.context.budget_usd  ? RankingRule::fastest_in_budget
                                           : RankingRule::cheapest;
  if (rule != ranking_rule_key(r.ranking_rule)) {
    throw o.error("rule", fmt::format("must be \"{}\" (deadline_days {}, budget_usd {})", ranking_rule_key(r.ranking_rule),
                                      d.context.deadline_days ? "given" : "null", d.context.budget_usd ? "given" : "null"));
  }
  std::vector<std::string> clusters;
  for (long long i : schema::integers(o, "options", 0, static_cast<long long>(r.options.size()) - 1)) {
    const CapacityOption& opt = r.options[static_cast<std::size_t>(i)];
    if (!opt.feasible || std::find(clusters.begin(), clusters.end(), opt.cluster) != clusters.end()) {
      throw o.error("options", fmt::format("must list feasible options of distinct clusters (options[{}] is {})", i,
                                           opt.feasible ? "a second option of " + opt.cluster : "infeasible"));
    }
    clusters.push_back(opt.cluster);
    r.ranking.push_back(static_cast<std::size_t>(i));
  }
  o.finish();
}

}  // namespace

json capacity_to_json(const CapacityResult& r, const CapacityContext& ctx) {
  json options = json::array();
  for (const CapacityOption& o : r.options) options.push_back(option_json(o, ctx.model));
  auto index = [](const std::optional<std::size_t>& i) { return i ? json(*i) : json(nullptr); };
  auto given = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  json j = {{"schema", kCapacitySchema},
            {"model", ctx.model},
            {"tokens", ctx.tokens},
            {"global_batch", ctx.global_batch},
            {"seq_len", ctx.seq_len},
            {"deadline_days", given(ctx.deadline_days)},
            {"budget_usd", given(ctx.budget_usd)},
            {"options", options},
            {"cheapest_within_deadline", index(r.cheapest_in_deadline)},
            {"fastest_within_budget", index(r.fastest_in_budget)},
            {"pareto", r.pareto},
            {"ranking", {{"rule", ranking_rule_key(r.ranking_rule)}, {"options", r.ranking}}},
            {"elapsed_s", r.elapsed_s}};
  if (r.reliability) j["reliability"] = reliability_json(*r.reliability);
  return j;
}

CapacityDoc capacity_from_json(const json& j, const std::string& file) {
  const JsonObject root(j, file);
  schema::check_schema(root, kCapacitySchema, "is this a capacity file?");
  CapacityDoc d;
  read_context(root, d.context);
  CapacityResult& r = d.result;
  for (const JsonObject& o : root.objects("options")) r.options.push_back(read_option(o));
  const std::size_t n = r.options.size();
  r.cheapest_in_deadline = read_pick(root, "cheapest_within_deadline", n);
  r.fastest_in_budget = read_pick(root, "fastest_within_budget", n);
  if (r.cheapest_in_deadline && !d.context.deadline_days) {
    throw root.error("cheapest_within_deadline", "must be null: deadline_days is null (no deadline was asked)");
  }
  if (r.fastest_in_budget && !d.context.budget_usd) {
    throw root.error("fastest_within_budget", "must be null: budget_usd is null (no budget was asked)");
  }
  // The picks and the front are chosen among the feasible options (sim/capacity.cpp pick_options),
  // the front naming each once.
  for (const auto& [key, pick] : {std::pair{"cheapest_within_deadline", r.cheapest_in_deadline},
                                  std::pair{"fastest_within_budget", r.fastest_in_budget}}) {
    if (pick && !r.options[*pick].feasible) {
      throw root.error(key, fmt::format("must name a feasible option (options[{}] is infeasible)", *pick));
    }
  }
  for (long long i : schema::integers(root, "pareto", 0, static_cast<long long>(n) - 1)) {
    const std::size_t k = static_cast<std::size_t>(i);
    if (!r.options[k].feasible || std::find(r.pareto.begin(), r.pareto.end(), k) != r.pareto.end()) {
      throw root.error("pareto", fmt::format("must list distinct feasible options (options[{}] is {})", i,
                                             r.options[k].feasible ? "listed twice" : "infeasible"));
    }
    r.pareto.push_back(k);
  }
  if (schema::has(root, "ranking")) read_ranking(root.object("ranking"), d);  // absent before the comparison existed
  r.elapsed_s = root.number("elapsed_s", 0, kInf);
  if (schema::has(root, "reliability")) r.reliability = read_reliability(root.object("reliability"));
  root.finish();
  return d;
}

}  // namespace trainplan

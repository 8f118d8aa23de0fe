#include "reports/simulation_json.hpp"

#include <fmt/format.h>

#include <iterator>

#include "reports/schema_fields.hpp"

namespace trainplan {

using nlohmann::json;
using schema::kInf;

namespace {

// Rank numbers: a plan has at most 2^24 GPUs (sim/strategy.hpp kMaxGpus).
constexpr long long kMaxRank = 1 << 24;

constexpr Stream kAllStreams[] = {Stream::compute, Stream::pp_forward, Stream::pp_backward, Stream::dp,
                                  Stream::ep, Stream::ps_server};
constexpr EventKind kAllKinds[] = {EventKind::forward,         EventKind::recompute,     EventKind::backward,
                                   EventKind::backward_weight, EventKind::optimizer,     EventKind::send_activation,
                                   EventKind::send_gradient,   EventKind::grad_reduce,   EventKind::zero3_gather,
                                   EventKind::param_gather,    EventKind::ps_push_pull,  EventKind::ps_update,
                                   EventKind::dispatch,        EventKind::combine};
static_assert(std::size(kAllKinds) == static_cast<std::size_t>(EventKind::combine) + 1, "every EventKind");

// The enum value whose to_string() is `name` (the file's spelling).
template <class E, std::size_t N>
std::optional<E> parse_spelling(const E (&all)[N], const std::string& name) {
  for (E v : all)
    if (name == to_string(v)) return v;
  return std::nullopt;
}

std::vector<int> read_ranks(const JsonObject& o) {
  std::vector<int> out;
  for (long long r : schema::integers(o, "ranks", 0, kMaxRank)) out.push_back(static_cast<int>(r));
  return out;
}

json stage_json(const SimulatedStage& s) {
  json j = {{"stage", s.stage},          {"ranks", s.ranks},
          {"busy_s", s.busy},          {"idle_s", s.idle},
          {"busy_share", s.busy_share}, {"compute_s", s.compute},
          {"recompute_s", s.recompute}, {"tp_s", s.tp},
          {"cp_s", s.cp},              {"optimizer_s", s.optimizer},
          {"wait_bubble_s", s.wait_bubble}, {"wait_pp_s", s.wait_pp},
          {"wait_dp_s", s.wait_dp},    {"pp_busy_s", s.pp_busy},
          {"dp_busy_s", s.dp_busy},    {"end_s", s.end}};
  if (s.ep > 0) j["ep_s"] = s.ep;
  return j;
}

SimulatedStage read_stage(const JsonObject& o) {
  SimulatedStage s;
  s.stage = static_cast<int>(o.integer("stage", 0, kMaxRank));
  s.ranks = read_ranks(o);
  auto sec = [&](const char* k) { return schema::seconds(o, k); };
  s.busy = sec("busy_s");
  s.idle = sec("idle_s");
  s.busy_share = o.number("busy_share", 0, 1);
  s.compute = sec("compute_s");
  s.recompute = sec("recompute_s");
  s.tp = sec("tp_s");
  s.cp = sec("cp_s");
  if (schema::has(o, "ep_s")) s.ep = sec("ep_s");
  s.optimizer = sec("optimizer_s");
  s.wait_bubble = sec("wait_bubble_s");
  s.wait_pp = sec("wait_pp_s");
  s.wait_dp = sec("wait_dp_s");
  s.pp_busy = sec("pp_busy_s");
  s.dp_busy = sec("dp_busy_s");
  s.end = sec("end_s");
  o.finish();
  return s;
}

json timeline_stage_json(const TimelineStage& s) {
  json stream = json::array(), kind = json::array(), mb = json::array(), chunk = json::array(),
       start = json::array(), end = json::array();
  for (const Event& e : s.events) {
    stream.push_back(to_string(e.stream));
    kind.push_back(to_string(e.kind));
    mb.push_back(e.micro_batch);
    chunk.push_back(e.chunk);
    start.push_back(e.start);
    end.push_back(e.end);
  }
  return {{"stage", s.stage},          {"ranks", s.ranks},           {"stream", std::move(stream)},
          {"kind", std::move(kind)},   {"micro_batch", std::move(mb)}, {"chunk", std::move(chunk)},
          {"start_s", std::move(start)}, {"end_s", std::move(end)}};
}

TimelineStage read_timeline_stage(const JsonObject& o) {
  TimelineStage s;
  s.stage = static_cast<int>(o.integer("stage", 0, kMaxRank));
  s.ranks = read_ranks(o);
  const std::vector<std::string> stream = schema::texts(o, "stream"), kind = schema::texts(o, "kind");
  const std::vector<long long> mb = schema::integers(o, "micro_batch", -1, 1LL << 40),
                               chunk = schema::integers(o, "chunk", -1, 1 << 24);
  const std::vector<double> start = schema::numbers(o, "start_s", 0, kInf), end = schema::numbers(o, "end_s", 0, kInf);
  const std::size_t n = stream.size();
  if (kind.size() != n || mb.size() != n || chunk.size() != n || start.size() != n || end.size() != n) {
    throw o.error("stream", "stream, kind, micro_batch, chunk, start_s and end_s must have the same length");
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto st = parse_spelling(kAllStreams, stream[i]);
    if (!st) throw InputError(fmt::format("{}: {}[{}] = \"{}\", is not a stream", o.file(), o.field("stream"), i, stream[i]));
    const auto k = parse_spelling(kAllKinds, kind[i]);
    if (!k) throw InputError(fmt::format("{}: {}[{}] = \"{}\", is not an event kind", o.file(), o.field("kind"), i, kind[i]));
    if (end[i] < start[i]) {
      throw InputError(fmt::format("{}: {}[{}] = {}, must not be before start_s[{}] = {}", o.file(), o.field("end_s"), i,
                                   end[i], i, start[i]));
    }
    s.events.push_back({s.stage, *st, *k, static_cast<int>(mb[i]), static_cast<int>(chunk[i]), start[i], end[i], -1});
  }
  o.finish();
  return s;
}

}  // namespace

std::vector<std::vector<int>> ranks_or_stages(const Timeline& t, const std::vector<std::vector<int>>& stage_ranks) {
  if (!stage_ranks.empty()) return stage_ranks;
  std::vector<std::vector<int>> out(t.stages.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = {static_cast<int>(i)};
  return out;
}

SimulationDoc simulation_doc(const Timeline& t, const std::vector<std::vector<int>>& stage_ranks, bool with_events) {
  const auto ranks = ranks_or_stages(t, stage_ranks);
  SimulationDoc d;
  d.step = t.step;
  d.events = static_cast<std::int64_t>(t.events.size());
  for (std::size_t i = 0; i < t.stages.size(); ++i) {
    const StageUsage& u = t.stages[i];
    const int s = static_cast<int>(i);
    d.stages.push_back({u.stage, i < ranks.size() ? ranks[i] : std::vector<int>{}, u.busy(), t.idle(s),
                        t.busy_share(s), u.compute, u.recompute, u.tp, u.cp, u.optimizer, u.wait_bubble, u.wait_pp,
                        u.wait_dp, u.pp_busy, u.dp_busy, u.end, u.ep});
  }
  if (!with_events) return d;
  d.timeline.emplace();
  for (std::size_t i = 0; i < t.stages.size(); ++i) {
    TimelineStage ts{t.stages[i].stage, i < ranks.size() ? ranks[i] : std::vector<int>{}, {}};
    for (const Event& e : t.events)
      if (e.stage == ts.stage) ts.events.push_back(e);
    d.timeline->push_back(std::move(ts));
  }
  return d;
}

json simulation_to_json(const SimulationDoc& d) {
  json stages = json::array();
  for (const SimulatedStage& s : d.stages) stages.push_back(stage_json(s));
  json j = {{"step_s", d.step}, {"stages", std::move(stages)}, {"events", d.events}};
  if (d.timeline) {
    json tl = json::array();
    for (const TimelineStage& s : *d.timeline) tl.push_back(timeline_stage_json(s));
    j["timeline"] = {{"stages", std::move(tl)}};
  }
  return j;
}

SimulationDoc simulation_from_json(const JsonObject& o) {
  SimulationDoc d;
  d.step = schema::seconds(o, "step_s");
  d.events = o.integer("events", 0, 1LL << 62);
  for (const JsonObject& s : o.objects("stages")) d.stages.push_back(read_stage(s));
  if (schema::has(o, "timeline")) {
    const JsonObject tl = o.object("timeline");
    d.timeline.emplace();
    for (const JsonObject& s : tl.objects("stages")) d.timeline->push_back(read_timeline_stage(s));
    tl.finish();
  }
  o.finish();
  return d;
}

json timeline_summary_json(const Timeline& t, const std::vector<std::vector<int>>& stage_ranks) {
  return simulation_to_json(simulation_doc(t, stage_ranks, false));
}

json timeline_events_json(const Timeline& t, const std::vector<std::vector<int>>& stage_ranks) {
  return simulation_to_json(simulation_doc(t, stage_ranks, true))["timeline"];
}

}  // namespace trainplan

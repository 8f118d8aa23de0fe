#include "reports/chrome_trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace trainplan {

using nlohmann::json;

namespace {

// The trace format's ts and dur are microseconds; they are written with nanosecond digits.
constexpr double kNanosecondsPerSecond = 1e9;
constexpr double kNanosecondsPerMicrosecond = 1e3;

// Seconds -> microseconds, rounded to whole nanoseconds (exact in the printed digits).
double microseconds(Seconds t) {
  return static_cast<double>(std::llround(t * kNanosecondsPerSecond)) / kNanosecondsPerMicrosecond;
}

int thread_id(Stream s) { return static_cast<int>(s) + 1; }

std::string event_name(const Event& e) {
  switch (e.kind) {
    case EventKind::forward: return fmt::format("F{}.{}", e.micro_batch, e.chunk);
    case EventKind::recompute: return fmt::format("R{}.{}", e.micro_batch, e.chunk);
    case EventKind::backward: return fmt::format("B{}.{}", e.micro_batch, e.chunk);
    case EventKind::backward_weight: return fmt::format("W{}.{}", e.micro_batch, e.chunk);
    case EventKind::send_activation: return fmt::format("send F{}.{}", e.micro_batch, e.chunk);
    case EventKind::send_gradient: return fmt::format("send B{}.{}", e.micro_batch, e.chunk);
    case EventKind::grad_reduce:
    case EventKind::dispatch:
    case EventKind::combine:
    case EventKind::ps_push_pull:
    case EventKind::zero3_gather: return fmt::format("{} {}.{}", to_string(e.kind), e.micro_batch, e.chunk);
    case EventKind::optimizer:
    case EventKind::ps_update:
    case EventKind::param_gather: return to_string(e.kind);
  }
  return to_string(e.kind);
}

json metadata(const char* name, int pid, int tid, const json& args) {
  return {{"name", name}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", args}};
}

// Parameter servers are processes of their own after the ranks: server s is pid kServerPid + s, with
// an "update" thread (their optimizer step) and one "push/pull from stage i" thread per stage (the
// traffic of that stage's ranks, which every server receives a share of).
constexpr int kServerPid = 1 << 20;
constexpr int kServerUpdateTid = 1;
int server_traffic_tid(int stage) { return 2 + stage; }

// The trace's events, one per line, comma-separated.
class EventLines {
 public:
  explicit EventLines(std::ostream& os) : os_(os) {}
  void operator()(const std::string& line) {
    os_ << (first_ ? "" : ",\n") << line;
    first_ = false;
  }

 private:
  std::ostream& os_;
  bool first_ = true;
};

// Names and order of the processes (ranks, then parameter servers) and their threads (streams).
void put_metadata(EventLines& put, const Timeline& t, const std::vector<std::vector<int>>& ranks) {
  for (std::size_t stage = 0; stage < ranks.size(); ++stage) {
    for (int rank : ranks[stage]) {
      if (rank < 0) continue;  // left out of the trace
      put(metadata("process_name", rank, 0, {{"name", fmt::format("rank {} (stage {})", rank, stage)}}).dump());
      put(metadata("process_sort_index", rank, 0, {{"sort_index", rank}}).dump());
      for (int s = 0; s < kStreams; ++s) {
        const auto stream = static_cast<Stream>(s);
        if (stream == Stream::ep && t.rank_streams() < kStreams) continue;  // a dense plan: no ep track
        put(metadata("thread_name", rank, thread_id(stream), {{"name", to_string(stream)}}).dump());
        put(metadata("thread_sort_index", rank, thread_id(stream), {{"sort_index", s}}).dump());
      }
    }
  }
  for (int s = 0; s < t.ps_servers; ++s) {
    const int pid = kServerPid + s;
    put(metadata("process_name", pid, 0, {{"name", fmt::format("parameter server {}", s)}}).dump());
    put(metadata("process_sort_index", pid, 0, {{"sort_index", pid}}).dump());
    put(metadata("thread_name", pid, kServerUpdateTid, {{"name", "update"}}).dump());
    for (std::size_t stage = 0; stage < ranks.size(); ++stage) {
      put(metadata("thread_name", pid, server_traffic_tid(static_cast<int>(stage)),
                   {{"name", fmt::format("push/pull from stage {}", stage)}}).dump());
    }
  }
}

// Every event as a complete ("X") event on each rank of its stage; parameter-server work and
// traffic also on every server.
void put_events(EventLines& put, const Timeline& t, const std::vector<std::vector<int>>& ranks) {
  for (const Event& e : t.events) {
    if (e.stage < 0 || static_cast<std::size_t>(e.stage) >= ranks.size()) continue;
    if (e.stream == Stream::ps_server || e.kind == EventKind::ps_push_pull) {
      const double ts = microseconds(e.start), dur = microseconds(e.end) - ts;
      const int tid = e.stream == Stream::ps_server ? kServerUpdateTid : server_traffic_tid(e.stage);
      for (int s = 0; s < t.ps_servers; ++s) {
        put(fmt::format(R"({{"name":"{}","cat":"{}","ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"args":{{"stage":{}}}}})",
                        event_name(e), to_string(e.kind), kServerPid + s, tid, ts, dur, e.stage));
      }
      if (e.stream == Stream::ps_server) continue;  // the servers' own work; workers show push/pull
    }
    std::string args = fmt::format("\"stage\":{}", e.stage);
    if (e.micro_batch >= 0) args += fmt::format(",\"micro_batch\":{}", e.micro_batch);
    if (e.chunk >= 0) args += fmt::format(",\"chunk\":{}", e.chunk);
    const std::string name = event_name(e);
    // Microseconds with nanosecond digits, from whole nanoseconds so that back-to-back events on
    // a track never overlap after rounding. Event names and kinds need no JSON escaping.
    const double ts = microseconds(e.start), dur = microseconds(e.end) - ts;
    for (int rank : ranks[e.stage]) {
      if (rank < 0) continue;
      put(fmt::format(R"({{"name":"{}","cat":"{}","ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"args":{{{}}}}})",
                      name, to_string(e.kind), rank, thread_id(e.stream), ts, dur, args));
    }
  }
}

// Flow arrows from each send to the slot that waited for it, rank j of the sending stage to
// rank j of the receiving one (the same TP/CP coordinates).
void put_flows(EventLines& put, const Timeline& t, const std::vector<std::vector<int>>& ranks) {
  long long flow_id = 0;
  for (const Event& e : t.events) {
    if (e.input_send < 0 || static_cast<std::size_t>(e.input_send) >= t.events.size()) continue;
    const Event& send = t.events[static_cast<std::size_t>(e.input_send)];
    if (static_cast<std::size_t>(std::max(send.stage, e.stage)) >= ranks.size()) continue;
    const auto& from = ranks[send.stage];
    const auto& to = ranks[e.stage];
    for (std::size_t j = 0; j < std::min(from.size(), to.size()); ++j) {
      if (from[j] < 0 || to[j] < 0) continue;
      ++flow_id;
      put(fmt::format(R"({{"name":"p2p","cat":"p2p","ph":"s","id":{},"pid":{},"tid":{},"ts":{:.3f}}})", flow_id,
                      from[j], thread_id(send.stream), microseconds(send.start)));
      put(fmt::format(R"({{"name":"p2p","cat":"p2p","ph":"f","bp":"e","id":{},"pid":{},"tid":{},"ts":{:.3f}}})",
                      flow_id, to[j], thread_id(e.stream), microseconds(e.start)));
    }
  }
}

}  // namespace

void write_chrome_trace(std::ostream& os, const Timeline& t, const std::vector<std::vector<int>>& stage_ranks,
                        const std::string& title) {
  const auto ranks = ranks_or_stages(t, stage_ranks);
  os << "{\"displayTimeUnit\":\"ms\",\"otherData\":" << json{{"title", title}, {"step_s", t.step}}.dump()
     << ",\"traceEvents\":[\n";
  EventLines put(os);
  put_metadata(put, t, ranks);
  put_events(put, t, ranks);
  put_flows(put, t, ranks);
  os << "\n]}\n";
}

}  // namespace trainplan

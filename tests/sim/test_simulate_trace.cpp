// reports/chrome_trace: a hand-built Timeline written as Chrome trace event JSON and as summary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "reports/chrome_trace.hpp"

namespace {

using namespace trainplan;
using nlohmann::json;

// Two stages; stage 0 runs a forward [0, 1 ms] and sends it [1, 1.5 ms]; stage 1 runs a forward
// [1.5, 2.5 ms] and the optimizer [2.5, 3 ms].
Timeline two_stage_timeline() {
  Timeline t;
  t.events = {{0, Stream::compute, EventKind::forward, 0, 0, 0.0, 1e-3},
              {0, Stream::pp_forward, EventKind::send_activation, 0, 0, 1e-3, 1.5e-3},
              {1, Stream::compute, EventKind::forward, 0, 0, 1.5e-3, 2.5e-3, 1},
              {1, Stream::compute, EventKind::optimizer, -1, -1, 2.5e-3, 3e-3}};
  t.step = 3e-3;
  StageUsage a, b;
  a.stage = 0;
  a.compute = 1e-3;
  a.pp_busy = 0.5e-3;
  a.end = 1.5e-3;
  b.stage = 1;
  b.compute = 1e-3;
  b.optimizer = 0.5e-3;
  b.wait_bubble = 1e-3;
  b.wait_pp = 0.5e-3;
  b.end = 3e-3;
  t.stages = {a, b};
  return t;
}

json trace_of(const Timeline& t, const std::vector<std::vector<int>>& ranks) {
  std::ostringstream os;
  write_chrome_trace(os, t, ranks, "test");
  return json::parse(os.str());
}

TEST(ChromeTrace, OneProcessPerRankOneThreadPerStream) {
  // Stage 0 runs on ranks 0 and 1 (TP 2), stage 1 on ranks 4 and 5.
  const json j = trace_of(two_stage_timeline(), {{0, 1}, {4, 5}});
  ASSERT_TRUE(j["traceEvents"].is_array());
  EXPECT_EQ(j["displayTimeUnit"], "ms");
  EXPECT_DOUBLE_EQ(j["otherData"]["step_s"].get<double>(), 3e-3);
  int processes = 0, threads = 0;
  std::vector<json> complete, flows;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "s" || e["ph"] == "f") flows.push_back(e);
    if (e["ph"] == "M" && e["name"] == "process_name") {
      ++processes;
      EXPECT_NE(e["args"]["name"].get<std::string>().find("rank " + std::to_string(e["pid"].get<int>())),
                std::string::npos);
    }
    if (e["ph"] == "M" && e["name"] == "thread_name") ++threads;
    if (e["ph"] == "X") complete.push_back(e);
  }
  EXPECT_EQ(processes, 4);
  EXPECT_EQ(threads, 4 * (kStreams - 1));  // a dense timeline: no ep track
  // Every event once per rank of its stage: 2 events x 2 ranks + 2 x 2.
  ASSERT_EQ(complete.size(), 8u);
  const json& f = complete[0];
  EXPECT_EQ(f["name"], "F0.0");
  EXPECT_EQ(f["cat"], "forward");
  EXPECT_EQ(f["pid"], 0);
  EXPECT_EQ(f["tid"], 1);  // compute
  EXPECT_DOUBLE_EQ(f["ts"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(f["dur"].get<double>(), 1000.0);  // microseconds
  EXPECT_EQ(f["args"]["micro_batch"], 0);
  const json& send = complete[2];
  EXPECT_EQ(send["name"], "send F0.0");
  EXPECT_EQ(send["tid"], 2);  // pp_forward
  EXPECT_DOUBLE_EQ(send["ts"].get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(send["dur"].get<double>(), 500.0);
  const json& opt = complete[6];
  EXPECT_EQ(opt["name"], "optimizer");
  EXPECT_EQ(opt["pid"], 4);
  EXPECT_FALSE(opt["args"].contains("micro_batch"));
  // The send feeds stage 1's forward: one arrow per TP rank, rank 0 -> 4 and 1 -> 5.
  ASSERT_EQ(flows.size(), 4u);
  EXPECT_EQ(flows[0]["ph"], "s");
  EXPECT_EQ(flows[0]["pid"], 0);
  EXPECT_EQ(flows[0]["tid"], 2);
  EXPECT_DOUBLE_EQ(flows[0]["ts"].get<double>(), 1000.0);
  EXPECT_EQ(flows[1]["ph"], "f");
  EXPECT_EQ(flows[1]["bp"], "e");
  EXPECT_EQ(flows[1]["pid"], 4);
  EXPECT_EQ(flows[1]["tid"], 1);
  EXPECT_DOUBLE_EQ(flows[1]["ts"].get<double>(), 1500.0);
  EXPECT_EQ(flows[1]["id"], flows[0]["id"]);
  EXPECT_EQ(flows[3]["pid"], 5);
  EXPECT_NE(flows[2]["id"], flows[0]["id"]);
}

TEST(ChromeTrace, WithoutRanksOneProcessPerStage) {
  const json j = trace_of(two_stage_timeline(), {});
  std::set<int> pids;
  for (const auto& e : j["traceEvents"]) pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
}

TEST(ChromeTrace, SummaryCopiesTheTimelineFigures) {
  const Timeline t = two_stage_timeline();
  const json s = timeline_summary_json(t, {{0, 1}, {4, 5}});
  EXPECT_DOUBLE_EQ(s["step_s"].get<double>(), 3e-3);
  EXPECT_EQ(s["events"], 4);
  ASSERT_EQ(s["stages"].size(), 2u);
  const json& b = s["stages"][1];
  EXPECT_EQ(b["ranks"], json({4, 5}));
  EXPECT_DOUBLE_EQ(b["busy_s"].get<double>(), 1.5e-3);
  EXPECT_DOUBLE_EQ(b["idle_s"].get<double>(), 1.5e-3);
  EXPECT_DOUBLE_EQ(b["busy_share"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(b["wait_bubble_s"].get<double>(), 1e-3);
  EXPECT_DOUBLE_EQ(b["wait_pp_s"].get<double>(), 0.5e-3);
}

}  // namespace

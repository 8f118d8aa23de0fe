// `trainplan simulate` on real model and cluster files: printed step time, Chrome trace validity
// (one process per rank, one thread per stream), JSON output, help and one-line errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "default_software.hpp"

namespace {

using trainplan::testing::run_merged;
using trainplan::testing::ScratchDir;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);  // throws (test fails) on invalid JSON
}

// "simulated step time: 17.869 s" -> seconds; also ms / us.
double printed_step(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(simulated step time: ([0-9.]+) (s|ms|us))"))) return -1;
  const double v = std::stod(m[1]);
  return m[2] == "s" ? v : m[2] == "ms" ? v * 1e-3 : v * 1e-6;
}

// GPT-3 175B on 64 A100s: tp 8, pp 8, interleaved with 3 chunks per stage, 64 micro-batches.
const std::string kGpt3 =
    "simulate --model gpt3-175b --cluster dgx-a100-80g --gpus 64 --tp 8 --pp 8 --vp 3 --schedule interleaved "
    "--global-batch 64 --recompute full";

TEST(SimulateCli, Gpt3TraceIsValidChromeTraceWithOneTrackPerRankAndStream) {
  const ScratchDir tmp;  // fresh: the files read below were written by this run
  const std::string trace = tmp.file("gpt3_trace.json");
  const std::string js = tmp.file("gpt3_sim.json");
  const auto r = run_merged(kGpt3 + " --trace " + trace + " --json " + js);
  ASSERT_EQ(r.code, 0) << r.output;
  const double step = printed_step(r.output);
  ASSERT_GT(step, 0) << r.output;
  EXPECT_NE(r.output.find("per-rank compute stream"), std::string::npos);
  EXPECT_NE(r.output.find("56-63"), std::string::npos) << "the last stage's ranks";

  const nlohmann::json t = read_json(trace);
  ASSERT_TRUE(t.contains("traceEvents"));
  ASSERT_TRUE(t["traceEvents"].is_array());
  std::set<int> processes;
  std::set<std::pair<int, int>> tracks, used;
  std::map<int, int> forwards_per_rank;
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> spans;  // per track
  std::map<long long, int> flows;  // id -> 1 per start + 10 per finish
  double last_end_us = 0;
  for (const auto& e : t["traceEvents"]) {
    const std::string ph = e.at("ph");
    ASSERT_TRUE(ph == "M" || ph == "X" || ph == "s" || ph == "f") << e.dump();
    const int pid = e.at("pid"), tid = e.at("tid");
    if (ph == "s" || ph == "f") {  // flow arrow send -> waiting slot
      flows[e.at("id").get<long long>()] += ph == "s" ? 1 : 10;
      continue;
    }
    if (ph == "M") {
      if (e["name"] == "process_name") processes.insert(pid);
      if (e["name"] == "thread_name") tracks.insert({pid, tid});
      continue;
    }
    const double ts = e.at("ts"), dur = e.at("dur");
    ASSERT_GE(ts, 0.0);
    ASSERT_GE(dur, 0.0);
    last_end_us = std::max(last_end_us, ts + dur);
    used.insert({pid, tid});
    spans[{pid, tid}].push_back({ts, ts + dur});
    if (e.at("cat") == "forward") ++forwards_per_rank[pid];
  }
  EXPECT_EQ(processes.size(), 64u) << "one process per rank";
  EXPECT_EQ(*processes.begin(), 0);
  EXPECT_EQ(*processes.rbegin(), 63);
  EXPECT_EQ(tracks.size(), 64u * 4) << "one thread per rank and stream";
  for (const auto& u : used) EXPECT_TRUE(tracks.count(u)) << "events on an unnamed track " << u.first << "/" << u.second;
  // Complete events on one track never overlap (viewers nest overlapping slices wrongly). Times
  // are whole nanoseconds, so 0.1 ns only absorbs the reader's ts + dur rounding.
  for (auto& [track, v] : spans) {
    std::sort(v.begin(), v.end());
    for (std::size_t i = 1; i < v.size(); ++i) {
      ASSERT_LE(v[i - 1].second, v[i].first + 1e-4) << "overlap on rank " << track.first << " thread " << track.second;
    }
  }
  EXPECT_FALSE(flows.empty());
  for (const auto& [id, n] : flows) EXPECT_EQ(n, 11) << "flow " << id << " needs one start and one finish";
  EXPECT_EQ(forwards_per_rank.size(), 64u);
  for (const auto& [rank, n] : forwards_per_rank) EXPECT_EQ(n, 64 * 3) << "rank " << rank;

  // The trace ends at the printed step time (printed with 3 decimals in seconds).
  EXPECT_NEAR(last_end_us * 1e-6, step, 1e-3 * step);
  EXPECT_NEAR(t["otherData"]["step_s"].get<double>(), last_end_us * 1e-6, 1e-6);

  const nlohmann::json j = read_json(js);
  EXPECT_EQ(j["schema"], "trainplan/prediction/v1");
  EXPECT_EQ(j["engine"], "des");
  EXPECT_DOUBLE_EQ(j["time"]["step_s"].get<double>(), j["simulation"]["step_s"].get<double>());
  EXPECT_NEAR(j["simulation"]["step_s"].get<double>(), last_end_us * 1e-6, 1e-6);
  ASSERT_EQ(j["simulation"]["stages"].size(), 8u);
  for (const auto& s : j["simulation"]["stages"]) {
    EXPECT_EQ(s["ranks"].size(), 8u);
    EXPECT_GT(s["busy_share"].get<double>(), 0.5);
    EXPECT_LE(s["busy_share"].get<double>(), 1.0);
    EXPECT_NEAR(s["busy_s"].get<double>() + s["idle_s"].get<double>(), j["simulation"]["step_s"].get<double>(), 1e-9);
  }
}

TEST(SimulateCli, OneFOneBWithDataParallelZero) {
  const ScratchDir tmp;  // fresh: the files read below were written by this run
  const std::string js = tmp.file("llama_sim.json");
  const auto r = run_merged(
      "simulate --model llama3-8b --cluster dgx-h100 --gpus 32 --tp 2 --pp 4 --zero 1 --global-batch 64 --seq 2048 "
      "--json " + js);
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = read_json(js);
  EXPECT_EQ(j["strategy"]["dp"], 4);
  EXPECT_GT(j["time"]["dp_comm_s"].get<double>(), 0.0) << j["time"].dump();
  EXPECT_NEAR(printed_step(r.output), j["simulation"]["step_s"].get<double>(), 1e-3 * j["simulation"]["step_s"].get<double>());
}

// Parameter-server runs put "ps push/pull" and "ps update" events in the timeline; the HTML chart
// refused its own simulator's timeline ("is not an event kind", exit 2) until it knew them.
TEST(SimulateCli, ParameterServerTimelineRendersAsHtml) {
  const ScratchDir tmp;
  const std::string html = tmp.file("ps.html");
  const auto r = run_merged("simulate --model tiny-gpt --cluster dgx-h100 --gpus 2 --dp-algorithm ps --global-batch 4 "
                            "--seq 64 --html " + html);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string page = trainplan::testing::slurp(html);
  EXPECT_NE(page.find("ps push/pull"), std::string::npos);
  EXPECT_NE(page.find("ps update"), std::string::npos);
}

TEST(SimulateCli, HelpExplainsEveryFlag) {
  const auto r = run_merged("simulate --help");
  ASSERT_EQ(r.code, 0);
  for (const char* flag : {"--trace FILE", "--json FILE", "--model", "--cluster", "--gpus", "--tp", "--pp", "--vp",
                           "--schedule", "--zero", "--global-batch", "--plan"}) {
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
  }
}

TEST(SimulateCli, BadInputIsOneLineAndExitTwo) {
  const auto unwritable = run_merged(kGpt3 + " --trace /nonexistent-dir/t.json");
  EXPECT_EQ(unwritable.code, 2);
  EXPECT_NE(unwritable.output.find("--trace /nonexistent-dir/t.json"), std::string::npos) << unwritable.output;
  EXPECT_EQ(std::count(unwritable.output.begin(), unwritable.output.end(), '\n'), 1) << unwritable.output;
  const auto unknown = run_merged(kGpt3 + " --tracefile x");
  EXPECT_EQ(unknown.code, 2) << unknown.output;
}

}  // namespace

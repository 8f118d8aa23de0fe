// The parameter-server, compression and failure flags on the command line: every bad value exits 2
// with one line naming the flag; good ones show up in the console and JSON and round-trip as --plan.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_fixture.hpp"

namespace {

using trainplan::testing::run_merged;

const std::string kPredict = "predict --model gpt2 --cluster dgx-h100 --gpus 16 --global-batch 32";
const std::string kSearch = "search --model gpt2 --cluster dgx-h100 --gpus 16 --global-batch 32 --threads 1";
const std::string kCapacity = "capacity --model gpt2 --tokens 1B --clusters dgx-h100 --gpus-range 8..16 --threads 1";

void expect_bad(const std::string& args, const std::string& flag) {
  const auto r = run_merged(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(flag), std::string::npos) << args << "\n" << r.output;
  std::size_t lines = 0;
  for (char ch : r.output) lines += ch == '\n';
  EXPECT_EQ(lines, 1u) << args << "\n" << r.output;
}

TEST(PsCli, BadValuesOfEveryNewPlanFlagExit2NamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--dp-algorithm ring", "--dp-algorithm"},
      {"--dp-algorithm", "--dp-algorithm"},
      {"--dp-algorithm ps --zero 1", "--dp-algorithm"},
      {"--dp-algorithm ps --ps-servers 0", "--ps-servers"},
      {"--dp-algorithm ps --ps-servers -3", "--ps-servers"},
      {"--dp-algorithm ps --ps-servers two", "--ps-servers"},
      {"--ps-servers 2", "--ps-servers"},                      // without servers
      {"--dp-algorithm ps --ps-servers 100000", "--ps-servers"},  // more nodes than the cluster has
      {"--dp-algorithm ps --ps-placement colocated --ps-servers 3", "--ps-servers"},  // job has 2 nodes
      {"--dp-algorithm ps --ps-placement rack", "--ps-placement"},
      {"--ps-placement colocated", "--ps-placement"},           // without servers
      {"--grad-compression zip", "--grad-compression"},
      {"--grad-compression powersgd", "--grad-compression"},
      {"--grad-compression powersgd:", "--grad-compression"},
      {"--grad-compression powersgd:0", "--grad-compression"},
      {"--grad-compression powersgd:-2", "--grad-compression"},
      {"--grad-compression powersgd:4x", "--grad-compression"},
      {"--grad-compression powersgd:99999999", "--grad-compression"},
      {"--grad-compression powersgd:4 --zero 1", "--grad-compression"},
      {"--grad-compression bf16", "--grad-compression"},        // gradients already 16-bit
  };
  for (const auto& [flags, name] : cases) expect_bad(kPredict + " " + flags, name);
}

TEST(PsCli, BadValuesOfTheSearchListsExit2) {
  expect_bad(kSearch + " --dp-algorithms allreduce,ring", "--dp-algorithms");
  expect_bad(kSearch + " --dp-algorithms ,", "--dp-algorithms");
  expect_bad(kSearch + " --grad-compressions none,powersgd:0", "--grad-compressions");
  expect_bad(kSearch + " --ps-servers 2", "--ps-servers");
  expect_bad(kSearch + " --dp-algorithms ps --ps-servers 0", "--ps-servers");
  expect_bad(kSearch + " --dp-algorithms ps --ps-placement x", "--ps-placement");
  expect_bad(kSearch + " --fp32-grad-accum maybe", "--fp32-grad-accum");
}

TEST(PsCli, BadValuesOfTheFailureFlagsExit2) {
  for (const char* v : {"0", "-1", "abc", "inf"}) expect_bad(kCapacity + " --mtbf-hours " + v, "--mtbf-hours");
  for (const char* v : {"0", "-1", "x"}) expect_bad(kCapacity + " --checkpoint-gbps " + v, "--checkpoint-gbps");
  for (const char* v : {"-1", "x"}) expect_bad(kCapacity + " --restart-minutes " + v, "--restart-minutes");
  expect_bad(kCapacity + " --reliability /nonexistent/r.json", "/nonexistent/r.json");
  expect_bad(kCapacity + " --elastic yes", "yes");
}

TEST(PsCli, PredictPrintsAndRoundTripsTheServerPlan) {
  const std::string path = ::testing::TempDir() + "/ps.json";
  const auto r = run_merged(kPredict + " --dp-algorithm ps-async --ps-servers 2 --grad-compression powersgd:4 --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("expected staleness 15 updates"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("powersgd:4"), std::string::npos) << r.output;
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["strategy"]["dp_algorithm"], "ps-async");
  EXPECT_EQ(j["strategy"]["ps_servers"], 2);
  EXPECT_EQ(j["strategy"]["grad_compression"], "powersgd:4");
  EXPECT_EQ(j["parameter_server"]["staleness_updates"], 15.0);
  const std::string again = ::testing::TempDir() + "/ps2.json";
  const auto r2 = run_merged("predict --plan " + path + " --json " + again);
  ASSERT_EQ(r2.code, 0) << r2.output;
  std::ifstream in2(again);
  const auto j2 = nlohmann::json::parse(in2);
  EXPECT_EQ(j2["strategy"], j["strategy"]);
  EXPECT_EQ(j2["time"], j["time"]);
}

TEST(PsCli, CapacityPrintsGoodputNextToTheFailureFreeFigures) {
  const std::string path = ::testing::TempDir() + "/cap.json";
  const auto r = run_merged(kCapacity + " --mtbf-hours 20000 --elastic --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("with failures (MTBF 20000 h per GPU"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("after losing one node"), std::string::npos) << r.output;
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["reliability"]["mtbf_gpu_hours"], 20000.0);
  const auto& o = j["options"][1];  // 16 GPUs
  ASSERT_TRUE(o["feasible"].get<bool>());
  const double goodput = o["failures"]["goodput"];
  EXPECT_GT(goodput, 0);
  EXPECT_LT(goodput, 1);
  EXPECT_NEAR(o["failures"]["days"].get<double>(), o["days"].get<double>() / goodput, 1e-9);
  EXPECT_EQ(o["elastic"]["gpus"], 8);
}

}  // namespace

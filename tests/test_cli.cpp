// The trainplan command on real files: output, JSON contract, and one-line errors with exit 2.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_fixture.hpp"

namespace {

using trainplan::testing::run_merged;
using trainplan::testing::ScratchDir;

const std::string kData = TRAINPLAN_TEST_DATA_DIR;
const std::string kPlan =
    "predict --model llama3-8b --cluster dgx-h100 --gpus 16 --tp 2 --pp 2 --global-batch 64 --micro-batch 2 --seq 2048";

TEST(Cli, PredictPrintsBreakdownWithUnits) {
  auto r = run_merged(kPlan);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step time"), std::string::npos);
  EXPECT_NE(r.output.find(" GB"), std::string::npos);
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos);
  EXPECT_NE(r.output.find("MFU"), std::string::npos);
  EXPECT_NE(r.output.find("dp4 tp2 pp2"), std::string::npos) << "dp defaults to gpus / (tp pp cp)";
}

TEST(Cli, PredictJsonFollowsTheContract) {
  const ScratchDir tmp;  // fresh: the files read below were written by this run
  const std::string path = tmp.file("p.json");
  auto r = run_merged(kPlan + " --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["schema"], "trainplan/prediction/v1");
  for (const char* k : {"feasible", "infeasible_reasons", "strategy", "memory", "time", "throughput"}) EXPECT_TRUE(j.contains(k)) << k;
  for (const char* k : {"peak_bytes", "capacity_bytes", "per_stage"}) EXPECT_TRUE(j["memory"].contains(k)) << k;
  for (const char* k : {"stage", "weights", "gradients", "optimizer", "activations", "other", "total"})
    EXPECT_TRUE(j["memory"]["per_stage"][0].contains(k)) << k;
  for (const char* k : {"step_s", "compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "pp_comm_s", "dp_comm_s",
                        "dp_comm_exposed_s", "bubble_s", "optimizer_s"})
    EXPECT_TRUE(j["time"].contains(k)) << k;
  for (const char* k : {"tokens_per_s", "tokens_per_s_per_gpu", "model_flops_per_step", "hardware_flops_per_step",
                        "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu"})
    EXPECT_TRUE(j["throughput"].contains(k)) << k;
  EXPECT_EQ(j["memory"]["per_stage"].size(), 2u);
  EXPECT_GT(j["time"]["step_s"].get<double>(), 0);

  // The same file works as --plan and gives the same prediction.
  const std::string again = tmp.file("p2.json");
  auto r2 = run_merged("predict --plan " + path + " --json " + again);
  ASSERT_EQ(r2.code, 0) << r2.output;
  std::ifstream in2(again);
  auto j2 = nlohmann::json::parse(in2);
  EXPECT_EQ(j2["time"], j["time"]);
}

TEST(Cli, PredictShowsTheCostPerStepAndItsPrice) {
  const ScratchDir tmp;  // fresh: the files read below were written by this run
  const std::string path = tmp.file("cost.json");
  auto r = run_merged(kPlan + " --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in);
  ASSERT_TRUE(j["cost"].is_object()) << j.dump();
  // USD per step = price per GPU-hour x GPUs x step / 3600 (dgx-h100's file says $3.00).
  const double step = j["time"]["step_s"].get<double>();
  EXPECT_DOUBLE_EQ(j["cost"]["price_per_gpu_hour_usd"].get<double>(), 3.0);
  EXPECT_NEAR(j["cost"]["usd_per_step"].get<double>(), 3.0 * 16 * step / 3600, 1e-12);
  EXPECT_NE(j["cost"]["price_source"].get<std::string>().find("dgx-h100"), std::string::npos);
  EXPECT_NE(r.output.find("cost: $"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("per step (16 GPUs x $3.00 per GPU-hour"), std::string::npos) << r.output;
}

TEST(Cli, PredictDetailLayersShowsEachStagesLayers) {
  const ScratchDir tmp;  // fresh: the files read below were written by this run
  const std::string path = tmp.file("layers.json");
  auto r = run_merged(kPlan + " --detail layers --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* part : {"per layer", "stage 0 (", "stage 1 (", "embedding", "LM head", "stage total", "recompute",
                           "activations"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in);
  ASSERT_TRUE(j.contains("layers"));
  const auto& stages = j["layers"]["stages"];
  ASSERT_EQ(stages.size(), 2u);
  int layers = 0;
  for (const auto& st : stages) {
    for (const auto& row : st["rows"]) {
      if (row["part"] == "layers") layers += row["count"].get<int>();
      EXPECT_GT(row["forward_s"].get<double>(), 0) << row.dump();
      EXPECT_GT(row["weights"].get<double>(), 0) << row.dump();
    }
  }
  EXPECT_EQ(layers, 32) << "llama3-8b has 32 layers";
  // Without the flag, no per-layer table or key.
  const std::string plain = tmp.file("plain.json");
  auto r2 = run_merged(kPlan + " --json " + plain);
  EXPECT_EQ(r2.output.find("per layer"), std::string::npos);
  std::ifstream in2(plain);
  EXPECT_FALSE(nlohmann::json::parse(in2).contains("layers"));
  auto bad = run_merged(kPlan + " --detail ops");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--detail"), std::string::npos) << bad.output;
}

TEST(Cli, SimulatorEngineGivesItsOwnStepTime) {
  const ScratchDir tmp;  // fresh: the files read below were written by this run
  const std::string path = tmp.file("des.json");
  const std::string plan =
      "predict --model gpt3-175b --cluster dgx-a100-80g --gpus 64 --tp 8 --pp 8 --vp 3 --global-batch 64 --recompute full";
  auto r = run_merged(plan + " --engine des --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(path);
  auto des = nlohmann::json::parse(in);
  EXPECT_EQ(des["engine"], "des");
  const std::string apath = tmp.file("analytic.json");
  ASSERT_EQ(run_merged(plan + " --json " + apath).code, 0);
  std::ifstream ain(apath);
  auto analytic = nlohmann::json::parse(ain);
  // Same work, different accounting of the pipeline: within 10% of each other but not identical.
  const double d = des["time"]["step_s"], a = analytic["time"]["step_s"];
  EXPECT_NE(d, a);
  EXPECT_NEAR(d / a, 1.0, 0.10);
  EXPECT_EQ(des["memory"], analytic["memory"]);
}

TEST(Cli, HuggingFaceConfigIsAccepted) {
  auto r = run_merged("predict --model " + kData + "/hf/llama3-8b/config.json --cluster dgx-h100 --gpus 8 --tp 8 --global-batch 8");
  EXPECT_EQ(r.code, 0) << r.output;
}

// Mistral-NeMo-12B's config sets head_dim 128 (attention 4096 wide, hidden 5120): 12.25B
// parameters (hand count in test_model_spec.cpp). At tp 8 a rank holds, bf16 with ZeRO 0:
//   layers  40 x (272,629,760 / 8 + 10,240 replicated RMSNorm weights) = 1,363,558,400
//   embedding and LM head (vocabulary-split) 2 x 131072 x 5120 / 8 = 167,772,160; final norm 5120
//   -> 1,531,335,680 parameters, 2 bytes each.
TEST(Cli, HuggingFaceHeadDimIsHonoured) {
  const std::string path = ::testing::TempDir() + "/nemo.json";
  std::remove(path.c_str());
  auto r = run_merged("predict --model " + kData + "/hf/mistral-nemo-12b/config.json --cluster dgx-h100 --gpus 8 --tp 8 " +
                      "--global-batch 8 --seq 4096 --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("12.25B parameters"), std::string::npos) << r.output;
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["memory"]["per_stage"][0]["weights"].get<double>(), 2.0 * 1531335680);
}

TEST(Cli, DropoutLeftOutByTheProfileIsNoted) {
  // gpt2-xl has dropout 0.1. pytorch-eager and trainplan-exec run none, so their figures leave it
  // out and each command says so on stderr (stdout stays the report); megatron-core costs it: no note.
  const std::string plan = "--model gpt2-xl --cluster dgx-h100 --global-batch 8";
  const std::string note = "gpt2-xl has dropout 0.1; software profile pytorch-eager runs none";
  for (const std::string& cmd : {"predict --gpus 1 " + plan, "simulate --gpus 1 " + plan, "search --gpus 1 " + plan}) {
    auto quiet = trainplan::testing::run_shell(std::string(TRAINPLAN_BINARY) + " " + cmd + " 2>&1 >/dev/null");
    EXPECT_EQ(quiet.code, 0) << cmd << ": " << quiet.output;
    EXPECT_EQ(quiet.output, "") << cmd << " with megatron-core";
    auto noted = trainplan::testing::run_shell(std::string(TRAINPLAN_BINARY) + " " + cmd +
                                               " --software pytorch-eager 2>&1 >/dev/null");
    EXPECT_EQ(noted.code, 0) << cmd;
    EXPECT_NE(noted.output.find(note), std::string::npos) << cmd << ": " << noted.output;
    EXPECT_EQ(std::count(noted.output.begin(), noted.output.end(), '\n'), 1) << cmd << ": " << noted.output;
  }
}

TEST(Cli, AttentionKernelWithoutATableIsNoted) {
  // llm-foundry runs FlashAttention-2: dgx-h100 has its published rates, dgx-a100-80g no table for
  // it, so there the calibrated table costs it and each command says so (one line on stderr).
  const std::string plan = " --model llama3-8b --gpus 8 --global-batch 8 --software llm-foundry 2>&1 >/dev/null";
  const std::string note = "software profile llm-foundry runs attention kernel flash2, which cluster dgx-a100-80g has no table for";
  for (const std::string cmd : {"predict --zero 3 --recompute full", "simulate --zero 3 --recompute full", "search"}) {
    auto quiet = trainplan::testing::run_shell(std::string(TRAINPLAN_BINARY) + " " + cmd + " --cluster dgx-h100" + plan);
    EXPECT_EQ(quiet.code, 0) << cmd << ": " << quiet.output;
    EXPECT_EQ(quiet.output, "") << cmd << " on dgx-h100";
    auto noted = trainplan::testing::run_shell(std::string(TRAINPLAN_BINARY) + " " + cmd + " --cluster dgx-a100-80g" + plan);
    EXPECT_EQ(noted.code, 0) << cmd << ": " << noted.output;
    EXPECT_NE(noted.output.find(note), std::string::npos) << cmd << ": " << noted.output;
    EXPECT_EQ(std::count(noted.output.begin(), noted.output.end(), '\n'), 1) << cmd << ": " << noted.output;
  }
}

TEST(Cli, InfeasiblePlanExitsThreeWithReason) {
  auto r = run_merged("predict --model gpt3-175b --cluster dgx-a100-80g --gpus 8 --tp 8 --global-batch 8");
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.output.find("out of memory"), std::string::npos) << r.output;
}

// Every bad input: exit code 2, exactly one line, naming the flag/file/field and the rule.
struct BadCase {
  std::string args;
  std::string expect;  // substring of the one line
};

class CliBadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(CliBadInput, ExitsTwoWithOneLine) {
  auto r = run_merged(GetParam().args);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find(GetParam().expect), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate"), std::string::npos);
}

const std::string kBase = "predict --cluster dgx-a100-80g --global-batch 64 ";

INSTANTIATE_TEST_SUITE_P(
    AllRules, CliBadInput,
    ::testing::Values(
        BadCase{kBase + "--model gpt2 --gpus 10 --tp 5", "--tp 5: must divide the model's heads (12)"},
        BadCase{kBase + "--model gpt2 --gpus 16 --tp 2 --dp 4", "--gpus 16: must equal dp x tp x pp x cp"},
        BadCase{kBase + "--model gpt2 --gpus 12 --tp 8", "--gpus 12: must be divisible by tp x pp x cp"},
        BadCase{"predict --cluster dgx-a100-80g --model gpt2 --gpus 8 --global-batch 12 --micro-batch 1",
                "--global-batch 12: must be divisible by dp x micro-batch (8 x 1)"},
        BadCase{kBase + "--model no-such-model --gpus 8", "--model no-such-model: not a built-in model"},
        BadCase{"predict --cluster no-such-cluster --model gpt2 --gpus 8 --global-batch 8", "--cluster no-such-cluster: not a built-in cluster"},
        BadCase{kBase + "--model /nonexistent/m.json --gpus 8", "/nonexistent/m.json: cannot open file"},
        BadCase{kBase + "--model " + kData + "/cli/truncated_model.json --gpus 8", "truncated_model.json: malformed JSON"},
        BadCase{"predict --model gpt2 --gpus 8 --global-batch 8 --cluster " + kData + "/cli/bad_topology.json",
                "bad_topology.json: network[1].efficiency = 1.3, must be in [0.001, 1]"},
        BadCase{kBase + "--model gpt2 --gpus 8 --recompute most", "--recompute most: must be one of none|selective|full"},
        BadCase{kBase + "--model gpt2 --gpus eight", "--gpus eight: must be an integer"},
        BadCase{kBase + "--model gpt2 --gpus 8 --zero 5", "--zero 5: must be in [0, 3]"},
        BadCase{kBase + "--model gpt2 --gpus 8 --pipeline 2", "--pipeline: unknown flag for 'trainplan predict'"},
        BadCase{"predict --model gpt2 --cluster dgx-a100-80g --gpus 8", "--global-batch: required"},
        BadCase{kBase + "--model gpt2 --gpus 3 --seq 1000 --cp 3", "--cp 3: 2 x cp must divide the sequence length (1000)"},
        BadCase{kBase + "--model gpt2 --gpus 8 --json /nonexistent/dir/out.json", "--json /nonexistent/dir/out.json: cannot write"},
        BadCase{kBase + "--model gpt2 --gpus 8 --plan /nonexistent/plan.json", "/nonexistent/plan.json: cannot open file"},
        BadCase{"search --model gpt2 --cluster dgx-a100-80g --gpus 8 --global-batch 8 --json /nonexistent/s.json",
                "--json /nonexistent/s.json: cannot write"},
        BadCase{"capacity --model gpt2 --tokens 1B --gpus-range 8..16 --json /nonexistent/c.json",
                "--json /nonexistent/c.json: cannot write"},
        BadCase{"compare " + kData + "/compare/prediction_pp2.json " + kData +
                    "/compare/measurement_pp2.json --json /nonexistent/m.json",
                "--json /nonexistent/m.json: cannot write"},
        BadCase{"frobnicate", "'frobnicate' is not a command"},
        BadCase{"", "trainplan: a command is required"},  // was the 17-line usage on stderr
        // Input files: only regular files, read with a size cap (a FIFO would block, /dev/zero never ends).
        BadCase{kBase + "--model /dev/zero --gpus 8", "/dev/zero: cannot open file (not a regular file"},
        BadCase{"predict --global-batch 64 --gpus 8 --model gpt2 --cluster /dev/urandom", "/dev/urandom: cannot open file (not a regular file"},
        BadCase{kBase + "--model /tmp --gpus 8", "--model /tmp: is a directory without a config.json"},
        BadCase{kBase + "--gpus 8 --model " + kData + "/cli/control_char_name_model.json",
                "name = \"evil\\u001b[2J\", must not contain control characters"},
        // Found by fuzzing: a name longer than the file system allows; a number beyond a double.
        BadCase{kBase + "--gpus 8 --model " + std::string(5000, 'm'), "not a built-in model"},
        BadCase{kBase + "--gpus 8 --model " + kData + "/cli/number_overflow_model.json", "malformed JSON: number overflow"},
        // Flag syntax: the message names the flag that is wrong, not the next one.
        BadCase{"predict --model gpt2 --cluster dgx-a100-80g --gpus --global-batch 64", "--gpus: needs a value"},
        BadCase{kBase + "--model gpt2 -gpus 8", "-gpus: flags start with two dashes (--gpus)"},
        BadCase{kBase + "--model gpt2 --gpus 8 --bogus", "--bogus: unknown flag for 'trainplan predict'"},
        BadCase{kBase + "--model gpt2 --gpus 8 --json", "--json: needs a value"},
        BadCase{"capacity --model gpt2 --tokens 1e300T", "--tokens 1e300T: must be at most 1e19 tokens"},
        BadCase{"capacity --model gpt2 --tokens 1T --clusters dgx-h100,dgx-h100", "names dgx-h100 twice"},
        BadCase{"compare " + kData + "/compare/prediction_pp2.json " + kData + "/compare/measurement_pp2.json --json " +
                    kData + "/compare/measurement_pp2.json",
                "is also an input file"},
        // Outputs are checked before work; two outputs may not be one file.
        BadCase{"simulate --model gpt2 --cluster dgx-a100-80g --gpus 8 --global-batch 64 --json /tmp --trace x.json",
                "--json /tmp: cannot write: it is a directory"}));

// A TRAINPLAN_DATA_DIR that names no folder is the one bad input, said once (it used to come out
// as "--model llama3-8b: not a built-in model (see /nonexistent/models)").
TEST(Cli, DataDirThatIsNoFolderIsNamed) {
  for (const std::string dir : {"/nonexistent", "/dev/null", ""}) {
    const auto r = trainplan::testing::run_shell("TRAINPLAN_DATA_DIR='" + dir + "' " + TRAINPLAN_BINARY +
                                                 " predict --model llama3-8b --cluster dgx-h100 --gpus 8 --global-batch 64 2>&1");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find("environment TRAINPLAN_DATA_DIR=" + dir + ": "), std::string::npos) << r.output;
  }
}

TEST(Cli, HelpExplainsEveryFlag) {
  auto r = run_merged("predict --help");
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--model", "--cluster", "--gpus", "--tp", "--pp", "--dp", "--cp", "--vp", "--zero", "--micro-batch",
                           "--global-batch", "--seq", "--recompute", "--sequence-parallel", "--schedule", "--dtype", "--json", "--plan",
                           "--detail"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
}

}  // namespace

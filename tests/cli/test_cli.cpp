// The trainplan command on real files: output, JSON contract, and one-line errors with exit 2.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "sim/check.hpp"

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

// ---- the files of a command, its outputs on failure, its memory, its lines --------------------

namespace fs = std::filesystem;
const std::string kBin = TRAINPLAN_BINARY;

// No output lands in the data folder's models/, topologies/, software/ or reliability/ (a file
// there is read as built-in data by every later run), however the path is written; the folder
// itself may hold outputs. The data folder is a copy, so a failing check writes into no source tree.
TEST(Cli, InputPaths_OutputNeverLandsInTheDataFolders) {
  const ScratchDir tmp;
  for (const char* sub : {"models", "topologies", "software", "reliability"}) {
    fs::copy(fs::path(TRAINPLAN_SOURCE_DIR) / sub, tmp.path() / sub, fs::copy_options::recursive);
  }
  const std::string env = "cd '" + tmp.path().string() + "' && TRAINPLAN_DATA_DIR='" + tmp.path().string() + "' ";
  const std::string predict = kBin + " " + kPlan + " ";
  for (const std::string& out : {tmp.file("models/new.json"), tmp.file("topologies/dgx-h100.json"),
                                std::string("software/x.json"), std::string("./reliability/../models/y.json")}) {
    SCOPED_TRACE(out);
    const auto before = trainplan::testing::slurp(tmp.file("topologies/dgx-h100.json"));
    const auto r = trainplan::testing::run_shell(env + predict + "--json " + out + " 2>&1");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find("is in the built-in data folder"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(tmp.path() / "models" / "new.json"));
    EXPECT_FALSE(fs::exists(tmp.path() / "software" / "x.json"));
    EXPECT_EQ(trainplan::testing::slurp(tmp.file("topologies/dgx-h100.json")), before);
  }
  const auto ok = trainplan::testing::run_shell(env + predict + "--json out.json --html models-report.html 2>&1");
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_TRUE(fs::exists(tmp.path() / "out.json"));
}

// Strings from files and from the command line that a console printer shows obey the error
// line's rule: file names with terminal escapes (C0 and C1) come out escaped, a 300-character
// cluster name is cut to 80 characters.
TEST(Cli, ErrorLineWriter_FileStringsOnStdoutArePrintable) {
  const ScratchDir tmp;
  const std::string prediction = tmp.file("p\x1b[2J.json"), measurement = tmp.file("m\xc2\x9b" "0m.json");
  fs::copy_file(kData + "/compare/prediction_pp2.json", prediction);
  fs::copy_file(kData + "/compare/measurement_pp2.json", measurement);
  const auto r = trainplan::testing::run_shell(kBin + " compare '" + prediction + "' '" + measurement + "' 2>&1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("p\\x1b[2J.json"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("m\\u{9b}0m.json"), std::string::npos) << r.output;

  nlohmann::json cluster = nlohmann::json::parse(trainplan::testing::slurp(std::string(TRAINPLAN_SOURCE_DIR) + "/topologies/dgx-h100.json"));
  const std::string long_name = "h100-" + std::string(295, 'n');
  cluster["name"] = long_name;
  std::ofstream(tmp.file("long.json")) << cluster.dump(2);
  const auto p = trainplan::testing::run_shell(kBin + " predict --model llama3-8b --gpus 16 --tp 2 --pp 2 --global-batch 64 "
                                               "--micro-batch 2 --seq 2048 --cluster " + tmp.file("long.json") + " 2>&1");
  EXPECT_EQ(p.code, 0) << p.output;
  EXPECT_EQ(p.output.find(long_name), std::string::npos) << "printed whole";
  EXPECT_NE(p.output.find("h100-nnnn"), std::string::npos) << p.output;
  for (const std::string& out : {r.output, p.output}) {
    std::size_t from = 0;
    for (std::size_t nl; (nl = out.find('\n', from)) != std::string::npos; from = nl + 1) {
      EXPECT_FALSE(trainplan::has_control_characters(out.substr(from, nl - from))) << out.substr(from, nl - from);
    }
  }
}

// An infeasible simulate writes its outputs, as predict does: the JSON with feasible false and the
// reasons, the page, an empty trace; before, it wrote nothing and left the last run's files.
TEST(Cli, OutputsOnFailure_InfeasibleSimulateWritesItsFiles) {
  const ScratchDir tmp;
  for (const char* f : {"s.json", "s.html", "t.json"}) std::ofstream(tmp.file(f)) << "stale: an earlier run's\n";
  const auto r = run_merged("simulate --model llama3-8b --cluster dgx-a100-80g --gpus 8 --global-batch 64 --dtype fp8 --json " +
                            tmp.file("s.json") + " --html " + tmp.file("s.html") + " --trace " + tmp.file("t.json"));
  EXPECT_EQ(r.code, 3) << r.output;
  const auto doc = nlohmann::json::parse(trainplan::testing::slurp(tmp.file("s.json")));
  EXPECT_EQ(doc["feasible"], false);
  EXPECT_NE(doc["infeasible_reasons"].dump().find("fp8"), std::string::npos) << doc.dump();
  EXPECT_EQ(doc["engine"], "des");
  const auto trace = nlohmann::json::parse(trainplan::testing::slurp(tmp.file("t.json")));
  EXPECT_TRUE(trace["traceEvents"].empty());
  EXPECT_NE(trace["otherData"]["title"].get<std::string>().find("not simulated"), std::string::npos);
  EXPECT_EQ(trainplan::testing::slurp(tmp.file("s.html")).find("stale"), std::string::npos);
  // And trainplan reads what it wrote.
  const auto report = run_merged("report " + tmp.file("s.json") + " --html " + tmp.file("r.html"));
  EXPECT_EQ(report.code, 0) << report.output;
}

// A file-size limit between the JSON (~2 KB) and the page (~12 KB) of a prediction: writing the
// page fails as a full disk would. In 512-byte blocks for dash (/bin/sh), 1024 for bash.
const std::string kSmallFiles = "ulimit -f 8; trap '' XFSZ; ";

// Every output is written (to its temporary) before any result is printed: a failed write is the
// command's only line, with nothing on stdout; before, the results were printed first.
TEST(Cli, OutputsOnFailure_WriteFailureIsTheOnlyLine) {
  const ScratchDir tmp;
  const auto r = trainplan::testing::run_shell(kSmallFiles + kBin + " predict --model llama3-8b --cluster dgx-h100 --gpus 8 "
                                               "--global-batch 64 --html " + tmp.file("p.html") + " 2>&1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_EQ(r.output.rfind("trainplan predict: --html ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find(": writing failed"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp.file("p.html")));
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 0) << "a temporary was left";
}

// When one output fails, none is replaced: the JSON, which fits, keeps its earlier content.
TEST(Cli, OutputsOnFailure_NoOutputReplacedWhenAnotherFails) {
  const ScratchDir tmp;
  std::ofstream(tmp.file("p.json")) << "previous\n";
  const auto r = trainplan::testing::run_shell(kSmallFiles + kBin + " predict --model llama3-8b --cluster dgx-h100 --gpus 8 "
                                               "--global-batch 64 --json " + tmp.file("p.json") + " --html " +
                                               tmp.file("p.html") + " 2>&1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--html"), std::string::npos) << r.output;
  EXPECT_EQ(trainplan::testing::slurp(tmp.file("p.json")), "previous\n");
  EXPECT_FALSE(fs::exists(tmp.file("p.html")));
}

// Out of memory (a limit far below what the inputs need) is one line and exit 1 wherever it
// happens: in a search's worker threads it was "terminate called ..." and an abort (exit 134).
TEST(Cli, MemoryBudget_OutOfMemoryEndsAsOneLine) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan reserves more address space than the limit";
#else
  const ScratchDir tmp;
  const auto r = trainplan::testing::run_shell(
      "ulimit -v 100000; " + kBin + " search --model llama3-70b --cluster dgx-h100 --gpus 1024 --global-batch 1024 "
      "--top 10000 --refine off --threads 4 --dp-algorithms allreduce,ps,ps-async --grad-compressions none,bf16,powersgd:4 "
      "--csv " + tmp.file("s.csv") + " 2>&1 >/dev/null");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_EQ(r.output.rfind("trainplan search: ", 0), 0u) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
#endif
}

// A search file can legally hold millions of candidate points (61 MB for 3.4 M); the report
// draws at most kMaxDrawnPoints of them, so it stays within 2 GiB (it ran out before) and the page small.
TEST(Cli, MemoryBudget_ReportDrawsAThinnedScatter) {
  const ScratchDir tmp;
  const auto s = run_merged("search --model llama3-8b --cluster dgx-h100 --gpus 64 --global-batch 512 --refine off --json " +
                            tmp.file("s.json"));
  ASSERT_EQ(s.code, 0) << s.output;
  nlohmann::json doc = nlohmann::json::parse(trainplan::testing::slurp(tmp.file("s.json")));
#if defined(__SANITIZE_ADDRESS__)
  const std::size_t n = 500000;  // the same path, in the time and memory of a sanitized build
  const std::string limit;
#else
  const std::size_t n = 3400000;
  const std::string limit = "ulimit -v 2097152; ";
#endif
  nlohmann::json steps = nlohmann::json::array(), bytes = nlohmann::json::array();
  for (std::size_t i = 0; i < n; ++i) {
    steps.push_back(static_cast<double>(1 + (i * 7919) % 8000) / 1000);          // 0.001 .. 8 s
    bytes.push_back(1000000000 + static_cast<long long>((i * 104729) % 8000) * 1000000);  // 1 .. 9 GB
  }
  doc["candidates"] = {{"feasible", n}, {"thinned", false}, {"step_s", steps}, {"peak_bytes", bytes}};
  std::ofstream(tmp.file("big.json")) << doc.dump();
  steps = bytes = doc = nullptr;
  const auto r = trainplan::testing::run_shell(limit + kBin + " report " + tmp.file("big.json") + " --html " +
                                               tmp.file("r.html") + " 2>&1");
  EXPECT_EQ(r.code, 0) << r.output;
  const std::string page = trainplan::testing::slurp(tmp.file("r.html"));
  EXPECT_LT(page.size(), 2u << 20);
  EXPECT_NE(page.find(" of " + std::to_string(n) + " predicted feasible candidates drawn (dominated points thinned"),
            std::string::npos);
}

// The capacity tables keep their columns aligned when a layout is longer than the usual column
// (expert layouts with recomputed modules): every row of a table is as long as its header.
TEST(Cli, CapacityTablesStayAlignedWithLongLayouts) {
  auto r = run_merged("capacity --model deepseek-v3 --tokens 1T --clusters dgx-h100 --gpus-range 256..256 --threads 2");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<std::string> lines;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::size_t tables = 0, longest_layout = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::size_t col = lines[i].find("best layout");
    if (col == std::string::npos) continue;
    ++tables;
    for (std::size_t k = i + 1; k < lines.size() && !lines[k].empty() && lines[k].find("price per") != 0; ++k) {
      EXPECT_EQ(lines[k].size(), lines[i].size()) << lines[i] << "\n" << lines[k];
      longest_layout = std::max(longest_layout, lines[k].find("  ", col) - col);
    }
  }
  EXPECT_EQ(tables, 2u) << r.output;  // the options and the buyer's comparison
  EXPECT_GT(longest_layout, 52u) << "the case should print a layout longer than the default column";
}

// An interleaved plan whose chunks do unequal work (gpt-oss-120b's 36 layers and its 201k-token LM
// head over 8 x 2 chunks) stalls its schedule more than the closed form charges: predict runs the
// step simulator beside it and says how far apart they are; a 1F1B plan, where the two agree
// within 3%, gets no such note.
TEST(Cli, PredictNotesWhereTheSimulatorDisagreesOnAnInterleavedPlan) {
  const std::string layout =
      "predict --model gpt-oss-120b --cluster dgx-h100 --gpus 32 --tp 4 --pp 8 --dp 1 --micro-batch 1 "
      "--global-batch 16 --seq 4096 --ep 2 --sequence-parallel on";
  auto interleaved = run_merged(layout + " --vp 2");
  ASSERT_TRUE(interleaved.code == 0 || interleaved.code == 3) << interleaved.output;
  EXPECT_NE(interleaved.output.find("note: the step simulator gives"), std::string::npos) << interleaved.output;
  auto des = run_merged(layout + " --vp 2 --engine des");
  EXPECT_EQ(des.output.find("note: the step simulator gives"), std::string::npos) << des.output;
  auto one_f_one_b = run_merged(layout);
  ASSERT_TRUE(one_f_one_b.code == 0 || one_f_one_b.code == 3) << one_f_one_b.output;
  EXPECT_EQ(one_f_one_b.output.find("note: the step simulator gives"), std::string::npos) << one_f_one_b.output;
}

}  // namespace

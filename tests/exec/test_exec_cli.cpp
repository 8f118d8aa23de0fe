// trainplan exec end to end on CPU: the measurement JSON (trainplan/measurement/v1) lists the
// measured steps with their loss, warm-up discarded, one entry per rank; `trainplan compare` reads
// it next to the prediction of the same plan on the cpu-local topology.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_fixture.hpp"

namespace {

namespace fs = std::filesystem;

using trainplan::testing::run_merged;
using trainplan::testing::run_shell;
using trainplan::testing::ScratchDir;

TEST(ExecCli, MeasurementJsonThenCompareWithPrediction) {
  const ScratchDir scratch;
  const fs::path& dir = scratch.path();
  const std::string plan = std::string("--model ") + TRAINPLAN_TEST_DATA_DIR +
                           "/exec/tiny-gpt.json --cluster cpu-local --dtype fp32 --global-batch 4 --micro-batch 1"
                           " --gpus 2 --pp 2 --schedule 1f1b";
  const fs::path p = dir / "p.json", m = dir / "m.json";
  auto pr = run_merged("predict " + plan + " --json " + p.string());
  ASSERT_EQ(pr.code, 0) << pr.output;
  auto er = run_merged("exec " + plan + " --nproc 2 --steps 3 --warmup 2 --json " + m.string());
  ASSERT_EQ(er.code, 0) << er.output;
  EXPECT_NE(er.output.find("step time: median"), std::string::npos) << er.output;

  std::ifstream f(m);
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j.at("schema"), "trainplan/measurement/v1");
  EXPECT_EQ(j.at("status"), "ok");
  ASSERT_EQ(j.at("steps").size(), 3u);
  EXPECT_EQ(j.at("steps")[0].at("step"), 2);  // two warm-up steps ran and were discarded
  for (const auto& s : j.at("steps")) {
    EXPECT_GT(s.at("loss").get<double>(), 0.0);
    EXPECT_GT(s.at("wall_s").get<double>(), 0.0);
  }
  EXPECT_EQ(j.at("memory").at("per_rank").size(), 2u);
  EXPECT_EQ(j.at("run").at("backend"), "gloo");

  auto cr = run_merged("compare " + p.string() + " " + m.string());
  EXPECT_EQ(cr.code, 0) << cr.output;
  EXPECT_NE(cr.output.find("step (median)"), std::string::npos) << cr.output;
}

// On cpu-local the ranks compute in fp32 whatever --dtype asks (unless --cpu-autocast on): the
// measurement's strategy says fp32, the requested bf16 is recorded beside it, and the console says
// both, so a comparison never takes an fp32 run for a bf16 one.
TEST(ExecCli, CpuRunRecordsTheDtypeItRan) {
  const ScratchDir scratch;
  const fs::path& dir = scratch.path();
  const fs::path m = dir / "m.json";
  auto er = run_merged(std::string("exec --model ") + TRAINPLAN_TEST_DATA_DIR +
                       "/exec/tiny-gpt.json --cluster cpu-local --dtype bf16 --global-batch 2 --micro-batch 1 "
                       "--steps 1 --warmup 0 --json " + m.string());
  ASSERT_EQ(er.code, 0) << er.output;
  EXPECT_NE(er.output.find("dtype fp32 (the plan asked for bf16)"), std::string::npos) << er.output;
  std::ifstream f(m);
  ASSERT_TRUE(f.good()) << m;
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j.at("strategy").at("dtype"), "fp32");
  EXPECT_EQ(j.at("run").at("requested_dtype"), "bf16");
  EXPECT_EQ(j.at("environment").at("compute_dtype"), "fp32");
}

// --cpu-autocast on runs a bf16 plan on the CPU under CPU autocast (fp32 master weights), and the
// measurement then records bf16 as the dtype run, with nothing requested beside it; fp8 it refuses.
TEST(ExecCli, CpuAutocastRunsAndRecordsBf16) {
  const ScratchDir scratch;
  const fs::path& dir = scratch.path();
  const fs::path m = dir / "m.json";
  const std::string plan = std::string("exec --model ") + TRAINPLAN_TEST_DATA_DIR +
                           "/exec/tiny-gpt.json --cluster cpu-local --global-batch 2 --micro-batch 1 --steps 1 "
                           "--warmup 0 --cpu-autocast on";
  auto er = run_merged(plan + " --dtype bf16 --json " + m.string());
  ASSERT_EQ(er.code, 0) << er.output;
  std::ifstream f(m);
  ASSERT_TRUE(f.good()) << m;
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j.at("strategy").at("dtype"), "bf16");
  EXPECT_FALSE(j.at("run").contains("requested_dtype")) << j.at("run").dump();
  EXPECT_EQ(j.at("environment").at("compute_dtype"), "bf16 (autocast, fp32 master)");
  auto bad = run_merged(plan + " --dtype fp8");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--cpu-autocast on"), std::string::npos) << bad.output;
}

// Under torchrun each process is one rank, told so by the environment; rank 0 serves the store.
TEST(ExecCli, TorchrunEnvironmentRanksRendezvous) {
  const int port = 20000 + static_cast<int>(getpid() % 20000);
  const std::string args = std::string(" exec --model ") + TRAINPLAN_TEST_DATA_DIR +
                           "/exec/tiny-gpt.json --cluster cpu-local --dtype fp32 --global-batch 4 --gpus 2 --tp 2"
                           " --steps 2 --warmup 0 --timeout 60";
  auto env = [&](int rank) {
    return "RANK=" + std::to_string(rank) + " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(rank) +
           " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " ";
  };
  const std::string cmd = "sh -c '" + env(1) + TRAINPLAN_BINARY + args + " >/dev/null 2>&1 & " + env(0) +
                          TRAINPLAN_BINARY + args + "; s=$?; wait $! || s=1; exit $s' 2>&1";
  const auto r = run_shell(cmd);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 CPU ranks"), std::string::npos) << r.output;
}

// The launcher's environment numbers are decimal digits only: " 29500" and "+2" were taken by
// strtol. Each is bad input (exit 2) naming the variable.
TEST(ExecCli, EnvironmentNumbersAreDigitsOnly) {
  const std::string args = std::string(" exec --model ") + TRAINPLAN_TEST_DATA_DIR +
                           "/exec/tiny-gpt.json --cluster cpu-local --dtype fp32 --global-batch 2 --steps 1 --warmup 0";
  // MASTER_PORT through the local launcher (--nproc), the ranks through torchrun's variables.
  for (const std::string env : {"MASTER_PORT=' 29500'", "MASTER_PORT=+29500", "RANK=+0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1",
                                "RANK=0 WORLD_SIZE=' 1' MASTER_ADDR=127.0.0.1"}) {
    const std::string launch = env.rfind("MASTER_PORT", 0) == 0 ? " --nproc 1" : "";
    const auto r = run_shell("env " + env + " " + TRAINPLAN_BINARY + args + launch + " 2>&1 >/dev/null");  // stderr only
    const std::string& err = r.output;
    EXPECT_EQ(r.code, 2) << env << ": " << err;
    EXPECT_NE(err.find("environment "), std::string::npos) << env << ": " << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << env << ": " << err;
  }
}

// Gloo ranks on a GPU (several ranks sharing one device, for correctness checks): runs where CUDA
// is present, else refused as bad input naming the flag. Either way the one-GPU correctness mode
// is reachable from the command line.
TEST(ExecCli, DeviceCudaWithGlooRunsOrIsRefusedWithoutGpu) {
  auto r = run_merged(std::string("exec --model ") + TRAINPLAN_TEST_DATA_DIR +
                      "/exec/tiny-gpt.json --cluster cpu-local --dtype fp32 --global-batch 2 --gpus 2 --tp 2"
                      " --nproc 2 --steps 1 --warmup 0 --device cuda --backend gloo");
  if (r.code == 2) {
    EXPECT_NE(r.output.find("--device cuda"), std::string::npos) << r.output;
  } else {
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("backend gloo on cuda"), std::string::npos) << r.output;
  }
}

// Vocabulary padding (Megatron's multiple of 128*tp): an odd vocabulary runs with tp 2 and the measurement says how many
// rows were added (the layer graph counts the unpadded vocabulary).
TEST(ExecCli, OddVocabularyIsPaddedAndReported) {
  const ScratchDir scratch;
  const fs::path& dir = scratch.path();
  const fs::path m = dir / "m.json";
  auto r = run_merged(std::string("exec --model ") + TRAINPLAN_TEST_DATA_DIR +
                      "/exec/tiny-gpt-oddvocab.json --cluster cpu-local --dtype fp32 --global-batch 2 --gpus 2"
                      " --tp 2 --nproc 2 --steps 1 --warmup 0 --json " + m.string());
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream f(m);
  const auto j = nlohmann::json::parse(f);
  const auto& pad = j.at("environment").at("vocab_padding");
  EXPECT_EQ(pad.at("vocab"), 251);
  EXPECT_EQ(pad.at("padded_vocab"), 256);  // a multiple of 128 * tp
}

// exec registers its files as every command does (cli/output.hpp CommandFiles): no output -- the
// --dump-* files included -- in the built-in data folders that every later run reads, and none the
// same file as an input (the --data token file included). Refused before any rank starts.
TEST(ExecCli, OutputsStayOutOfTheDataFoldersAndApartFromInputs) {
  const ScratchDir scratch;
  const fs::path data = scratch.path() / "data";
  for (const char* f : {"models/tiny-gpt.json", "topologies/cpu-local.json", "software/trainplan-exec.json"}) {
    fs::create_directories((data / f).parent_path());
    fs::copy_file(fs::path(TRAINPLAN_SOURCE_DIR) / f, data / f);
  }
  const std::string exec = "TRAINPLAN_DATA_DIR='" + data.string() + "' '" + TRAINPLAN_BINARY +
                           "' exec --model tiny-gpt --cluster cpu-local --nproc 1 --global-batch 1 --steps 1 --warmup 0 ";
  for (const auto& [flag, out] : {std::pair{"--json", data / "topologies/run.json"}, std::pair{"--dump-params", data / "models/p"},
                                  std::pair{"--dump-grads", data / "software/g"}}) {
    const auto r = run_shell(exec + flag + " " + out.string() + " 2>&1");
    EXPECT_EQ(r.code, 2) << r.output;
    // (The line shortens the long scratch paths in its middle.)
    const std::string tail = "data/" + out.parent_path().filename().string() + "/" + out.filename().string();
    EXPECT_EQ(r.output.rfind(std::string("trainplan exec: ") + flag + " ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(tail + ": is in the built-in data folder"), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(data)) files += e.is_regular_file();
  EXPECT_EQ(files, 3) << "an output was written into the data folder";
  // The token file is an input too, of any size (it is read in pieces, outside the input budget).
  const fs::path tokens = scratch.path() / "tokens.bin";
  std::ofstream(tokens, std::ios::binary) << std::string(4096, '\0');
  const auto r = run_shell(exec + "--data " + tokens.string() + " --json " + tokens.string() + " 2>&1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("tokens.bin: is also an input file (--data "), std::string::npos) << r.output;
}

// A mixture-of-experts model from the command line: two CPU ranks over Gloo, each holding two of
// tiny-moe's four experts (--ep 2); the console and the JSON say what ran, and the JSON lists each
// rank's all-to-all bytes. Bad expert input exits 2 with one line naming the flag.
TEST(ExecCli, MixtureOfExpertsRunsWithExpertParallelism) {
  const ScratchDir scratch;
  const fs::path m = scratch.path() / "m.json";
  const std::string plan = std::string("exec --model ") + TRAINPLAN_TEST_DATA_DIR +
                           "/exec/tiny-moe.json --cluster cpu-local --dtype fp32 --global-batch 4 --micro-batch 1 "
                           "--gpus 2 --nproc 2 --backend gloo --steps 2 --warmup 0";
  auto er = run_merged(plan + " --ep 2 --json " + m.string());
  ASSERT_EQ(er.code, 0) << er.output;
  EXPECT_NE(er.output.find("step time: median"), std::string::npos) << er.output;
  std::ifstream f(m);
  ASSERT_TRUE(f.good()) << m;
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j.at("status"), "ok");
  const auto& ep = j.at("environment").at("expert_parallel");
  EXPECT_EQ(ep.at("ep"), 2);
  EXPECT_EQ(ep.at("edp"), 1);
  ASSERT_EQ(ep.at("per_rank").size(), 2u);
  for (const auto& r : ep.at("per_rank")) EXPECT_GT(r.at("token_bytes_per_step").get<double>(), 0.0) << r;

  auto bad = run_merged(plan + " --ep 3 --json " + m.string());
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_EQ(std::count(bad.output.begin(), bad.output.end(), '\n'), 1) << bad.output;
  EXPECT_NE(bad.output.find("--ep 3"), std::string::npos) << bad.output;
}

// --trace: one step after the measured ones under the profiler, one chrome trace per rank holding
// the forward and the backward's operators; the measurement still counts only the measured steps.
TEST(ExecCli, TraceWritesOneProfiledStepPerRank) {
  const ScratchDir scratch;
  const fs::path& dir = scratch.path();
  const fs::path m = dir / "m.json";
  auto r = run_merged(std::string("exec --model ") + TRAINPLAN_TEST_DATA_DIR +
                      "/exec/tiny-gpt.json --cluster cpu-local --dtype fp32 --global-batch 4 --micro-batch 1 --dp 2"
                      " --nproc 2 --steps 2 --warmup 0 --json " + m.string() + " --trace " + (dir / "t").string());
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream mf(m);
  EXPECT_EQ(nlohmann::json::parse(mf).at("steps").size(), 2u);
  for (int rank : {0, 1}) {
    const fs::path t = dir / ("t.rank" + std::to_string(rank) + ".json");
    ASSERT_TRUE(fs::exists(t)) << t;
    std::ifstream f(t);
    const auto j = nlohmann::json::parse(f);
    int ops = 0;
    bool forward = false, backward = false;
    for (const auto& e : j.at("traceEvents")) {
      if (e.value("cat", "") != "cpu_op") continue;
      ++ops;
      const std::string name = e.value("name", "");
      forward = forward || name == "aten::embedding";
      backward = backward || name.find("EmbeddingBackward") != std::string::npos;
    }
    EXPECT_GT(ops, 50) << t;
    EXPECT_TRUE(forward && backward) << t;
  }
  for (const auto& e : fs::directory_iterator(dir))  // each trace renamed into place, no temporary left
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(ExecCli, HelpListsExecutionFlags) {
  auto r = run_merged("exec --help");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--nproc N"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--backend nccl|gloo"), std::string::npos) << r.output;
}

}  // namespace

// `trainplan search` and `trainplan capacity` end to end on the real binary: tables, JSON schema
// fields, the --plan round trip, bad input as one line with exit code 2.
#include "cli_fixture.hpp"
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using trainplan::testing::Result;
using trainplan::testing::slurp;

class SearchCli : public trainplan::testing::CliTest {};

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST_F(SearchCli, RanksLayoutsAndWritesSearchJson) {
  const fs::path out = dir_ / "search.json";
  const Result r = run("search --model llama2-7b --cluster dgx-h100 --gpus 16 --global-batch 64 --top 3 --json " +
                       out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("rank"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MFU %"), std::string::npos);
  EXPECT_NE(r.out.find("searched"), std::string::npos);
  EXPECT_TRUE(r.err.empty()) << "no progress bar when stdout is not a terminal: " << r.err;
  const json j = read(out);
  EXPECT_EQ(j.at("schema"), "trainplan/search/v1");
  const json& s = j.at("search");
  for (const char* k : {"evaluated", "feasible", "infeasible_by_reason", "elapsed_s", "threads"}) {
    EXPECT_TRUE(s.contains(k)) << k;
  }
  std::int64_t infeasible = 0;
  for (const auto& [reason, n] : s.at("infeasible_by_reason").items()) infeasible += n.get<std::int64_t>();
  EXPECT_EQ(infeasible, s.at("evaluated").get<std::int64_t>() - s.at("feasible").get<std::int64_t>());
  ASSERT_EQ(j.at("top").size(), 3u);
  for (const json& p : j.at("top")) {
    EXPECT_EQ(p.at("schema"), "trainplan/prediction/v1");
    EXPECT_TRUE(p.at("feasible").get<bool>());
    EXPECT_TRUE(p.contains("strategy") && p.contains("memory") && p.contains("time") && p.contains("throughput"));
  }
  EXPECT_GE(j.at("top")[0].at("throughput").at("tokens_per_s").get<double>(),
            j.at("top")[1].at("throughput").at("tokens_per_s").get<double>());
  EXPECT_TRUE(j.at("pareto").is_array());
  EXPECT_FALSE(j.at("pareto").empty());

  // The best entry is a plan for trainplan predict, which reproduces its (simulated) step time.
  EXPECT_EQ(j.at("top")[0].at("engine"), "des");
  const fs::path pred = dir_ / "pred.json";
  const Result p = run("predict --engine des --plan " + out.string() + " --json " + pred.string());
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_DOUBLE_EQ(read(pred).at("time").at("step_s").get<double>(), j.at("top")[0].at("time").at("step_s").get<double>());
}

// The first table row (rank 1) of a search's console output.
std::string first_row(const std::string& out) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("   1  ", 0) == 0) return line;
  }
  return "";
}

TEST_F(SearchCli, TopOneNamesTheBestOfTopTen) {
  // GPT-3 175B on 64 A100s: the simulator ranks the analytic third first, so simulating only the
  // analytic best (the rule before the refinement window) made --top 1 name another layout.
  const std::string args = "search --model gpt3-175b --cluster dgx-a100-80g --gpus 64 --global-batch 64 --top ";
  const Result one = run(args + "1"), ten = run(args + "10");
  ASSERT_EQ(one.code, 0) << one.err;
  ASSERT_EQ(ten.code, 0) << ten.err;
  ASSERT_FALSE(first_row(ten.out).empty()) << ten.out;
  EXPECT_EQ(first_row(one.out), first_row(ten.out));
  EXPECT_NE(one.out.find("the analytic top 10 re-ranked by the step simulator"), std::string::npos) << one.out;
}

TEST_F(SearchCli, CudaGraphsReachEveryCandidateAndThePlan) {
  // One CUDA graph per step is a setting of the whole space: each candidate carries it, the search
  // file records it, and predict --plan runs the best entry with it. Without host time per kernel
  // no layout gets slower.
  const std::string args = "search --model qwen3-30b-a3b --cluster dgx-h100 --gpus 8 --global-batch 64 --max-pp 1 "
                           "--top 1 --json ";
  const fs::path graphed = dir_ / "graphed.json", eager = dir_ / "eager.json";
  const Result g = run(args + graphed.string() + " --cuda-graphs full"), e = run(args + eager.string());
  ASSERT_EQ(g.code, 0) << g.err;
  ASSERT_EQ(e.code, 0) << e.err;
  const json jg = read(graphed), je = read(eager);
  EXPECT_EQ(jg.at("space").at("cuda_graphs"), "full");
  EXPECT_FALSE(je.at("space").contains("cuda_graphs"));
  EXPECT_EQ(jg.at("top").at(0).at("strategy").at("cuda_graphs"), "full");
  EXPECT_LE(jg.at("top").at(0).at("time").at("step_s").get<double>(),
            je.at("top").at(0).at("time").at("step_s").get<double>());
  const Result plan = run("predict --plan " + graphed.string());
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_NE(plan.out.find(" graphs "), std::string::npos) << plan.out;
}

TEST_F(SearchCli, PerLayerCudaGraphsReachEveryCandidateAndLeaveFullRecomputationOut) {
  // Per-layer graphs are a setting of the whole space too: every candidate carries them, the search
  // file records them, predict --plan runs the best entry with them, and no candidate recomputes
  // whole layers (Megatron-core runs full recomputation only with the whole-iteration graph).
  const fs::path out = dir_ / "regions.json";
  const Result r = run("search --model qwen3-30b-a3b --cluster dgx-h100 --gpus 8 --global-batch 64 --max-pp 1 "
                       "--top 20 --recompute none,full --cuda-graph-modules attn,moe_router,moe_preprocess --json " +
                       out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = read(out);
  EXPECT_EQ(j.at("space").at("cuda_graph_modules"), "attn,moe_router,moe_preprocess");
  ASSERT_FALSE(j.at("top").empty());
  for (const json& entry : j.at("top")) {
    EXPECT_EQ(entry.at("strategy").at("cuda_graph_modules"), "attn,moe_router,moe_preprocess");
    EXPECT_NE(entry.at("strategy").at("recompute"), "full");
  }
  const Result plan = run("predict --plan " + out.string());
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_NE(plan.out.find(" graphs:attn,moe_router,moe_preprocess"), std::string::npos) << plan.out;
  const Result only_full = run("search --model qwen3-30b-a3b --cluster dgx-h100 --gpus 8 --global-batch 64 "
                               "--recompute full --cuda-graph-modules attn");
  EXPECT_EQ(only_full.code, 2);
  EXPECT_NE(only_full.err.find("--cuda-graph-modules attn: needs --recompute none or selective"), std::string::npos)
      << only_full.err;
}

TEST_F(SearchCli, NothingFitsExitsThreeAndSaysWhy) {
  const Result r = run("search --model llama3-70b --cluster dgx-a100-80g --gpus 8 --global-batch 8");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.out.find("no feasible layout"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("out of memory"), std::string::npos) << r.out;
}

TEST_F(SearchCli, CapacityPrintsAndWritesEveryFigure) {
  const fs::path out = dir_ / "capacity.json";
  const Result r = run("capacity --model llama2-7b --tokens 300B --clusters dgx-a100-80g,dgx-h100 --gpus-range 8..32 "
                       "--global-batch 256 --deadline-days 60 --budget-usd 2000000 --json " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("cheapest within 60 days"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fastest within $2000000"), std::string::npos) << r.out;
  const json j = read(out);
  EXPECT_EQ(j.at("schema"), "trainplan/capacity/v1");
  EXPECT_EQ(j.at("tokens").get<double>(), 300e9);
  ASSERT_EQ(j.at("options").size(), 6u);  // 8, 16, 32 GPUs x 2 kinds
  for (const json& o : j.at("options")) {
    ASSERT_TRUE(o.at("feasible").get<bool>());
    for (const char* k : {"cluster", "gpus", "layout", "days", "gpu_hours", "cost_usd", "energy_kwh",
                          "price_per_gpu_hour_usd", "power_per_gpu_w", "best"}) {
      EXPECT_TRUE(o.contains(k)) << k;
    }
    EXPECT_EQ(o.at("best").at("schema"), "trainplan/prediction/v1");
    // Each printed row carries the layout and the day count as printed.
    EXPECT_NE(r.out.find(o.at("layout").get<std::string>()), std::string::npos);
  }
  EXPECT_TRUE(j.at("cheapest_within_deadline").is_number());
  EXPECT_TRUE(j.at("fastest_within_budget").is_number());
  EXPECT_FALSE(j.at("pareto").empty());
}

// The buyer's comparison: one line per cluster, its cheapest option in the deadline, with a price
// given on the command line in place of the file's, in the table and in the JSON.
TEST_F(SearchCli, CapacityRanksClustersWithAGivenPrice) {
  const fs::path out = dir_ / "capacity.json";
  const Result r = run("capacity --model llama2-7b --tokens 300B --clusters dgx-h100,dgx-b200,mi300x --gpus-range 8..32 "
                       "--global-batch 256 --deadline-days 60 --price mi300x=1.5 --json " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("buyer's comparison: each cluster's cheapest option within 60 days, by cost"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("mi300x $1.50 (--price)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dgx-h100 $3.00 (cluster file, assumed)"), std::string::npos) << r.out;
  const json j = read(out);
  EXPECT_EQ(j.at("ranking").at("rule"), "cheapest_within_deadline");
  const json& ranked = j.at("ranking").at("options");
  ASSERT_EQ(ranked.size(), 3u);
  double last = 0;
  for (const json& i : ranked) {
    const json& o = j.at("options").at(i.get<std::size_t>());
    const double cost = o.at("failures").at("cost_usd").get<double>();
    EXPECT_GE(cost, last);
    last = cost;
    EXPECT_LE(o.at("failures").at("days").get<double>(), 60);
    EXPECT_NE(r.out.find(o.at("layout").get<std::string>()), std::string::npos);
  }
  for (const json& o : j.at("options")) {
    const bool given = o.at("cluster") == "mi300x";
    EXPECT_EQ(o.at("price_source"), given ? "--price" : "cluster file");
    if (given) {
      EXPECT_EQ(o.at("price_per_gpu_hour_usd"), 1.5);
    }
  }
  // The report reads it back.
  EXPECT_EQ(run("report " + out.string() + " --html " + (dir_ / "c.html").string()).code, 0);
}

TEST_F(SearchCli, BadInputIsOneLineWithExitTwo) {
  const char* cases[] = {
      "search --model llama2-7b --cluster dgx-h100 --gpus 16 --global-batch 64 --bogus 1",
      "search --model llama2-7b --cluster dgx-h100 --gpus 16",
      "search --model llama2-7b --cluster dgx-h100 --gpus 0 --global-batch 64",
      "search --model llama2-7b --cluster dgx-h100 --gpus 16 --global-batch 64 --objective speed",
      "search --model llama2-7b --cluster dgx-h100 --gpus 16 --global-batch 64 --recompute none,some",
      "search --model llama2-7b --cluster dgx-a100-80g --gpus 16 --global-batch 64 --dtype fp8",
      "capacity --model llama2-7b --tokens lots",
      "capacity --model llama2-7b --tokens 1T --gpus-range 64..8",
      "capacity --model llama2-7b --tokens 1T --clusters nowhere",
  };
  for (const char* args : cases) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
    EXPECT_EQ(lines(r.err), 1) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("trainplan ", 0), 0u) << r.err;
  }
  const Result flag = run("search --model llama2-7b --cluster dgx-h100 --gpus 16 --global-batch 64 --bogus 1");
  EXPECT_NE(flag.err.find("--bogus"), std::string::npos) << flag.err;
  const Result objective = run("search --model llama2-7b --cluster dgx-h100 --gpus 16 --global-batch 64 --objective speed");
  EXPECT_NE(objective.err.find("--objective"), std::string::npos) << objective.err;
}

// An MoE model: the search lays experts over ep (and etp) ranks within the flags' limits, the space
// and its expert part round-trip through the search document, and the best entry is a plan.
TEST_F(SearchCli, SearchesExpertLayoutsOfAnMoeModel) {
  const fs::path out = dir_ / "search.json";
  const Result r = run("search --model qwen3-30b-a3b --cluster dgx-h100 --gpus 16 --global-batch 64 --top 5 --max-ep 4 "
                       "--moe-imbalance 1.25 --etp 1 --json " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = read(out);
  const json& x = j.at("space").at("experts");
  EXPECT_EQ(x.at("max_ep"), 4);
  EXPECT_EQ(x.at("etp"), json::array({"1"}));
  EXPECT_EQ(x.at("moe_imbalance"), 1.25);
  bool any_ep = false;
  for (const json& p : j.at("top")) {
    const json& s = p.at("strategy");
    const int ep = s.value("ep", 1);
    EXPECT_LE(ep, 4) << s;
    EXPECT_GE(ep, 2 * (ep > 1)) << "ep 2..4 only from the imbalance 1.25 up";
    EXPECT_EQ(s.value("etp", 1), 1) << s;
    EXPECT_EQ(s.value("moe_imbalance", 1.0), ep > 1 ? 1.25 : 1.0) << s;
    if (s.at("tp").get<int>() > 1) EXPECT_TRUE(s.at("sequence_parallel").get<bool>()) << s;
    any_ep |= ep > 1;
  }
  EXPECT_TRUE(any_ep) << "expert parallelism should pay off for 128 experts on 16 GPUs: " << r.out;
  EXPECT_EQ(run("predict --engine des --plan " + out.string()).code, 0);
  EXPECT_EQ(run("report " + out.string() + " --html " + (dir_ / "s.html").string()).code, 0);
  // A dense search writes no expert part (its documents keep their keys).
  const fs::path dense = dir_ / "dense.json";
  ASSERT_EQ(run("search --model llama2-7b --cluster dgx-h100 --gpus 8 --global-batch 64 --top 1 --json " + dense.string()).code, 0);
  EXPECT_FALSE(read(dense).at("space").contains("experts"));
}

// Without --moe-dispatcher an MoE plan runs the software profile's dispatcher (megatron-core: flex,
// as NVIDIA's recipes; pytorch-eager: alltoall), search and exec alike; a dense plan keeps
// alltoall (no key), and the flag overrides the profile.
TEST_F(SearchCli, TheDispatcherDefaultsToTheSoftwareProfiles) {
  auto dispatcher_of = [&](const std::string& args) {
    const fs::path out = dir_ / "p.json";
    fs::remove(out);
    const Result r = run("predict " + args + " --json " + out.string());
    EXPECT_TRUE(r.code == 0 || r.code == 3) << args << ": " << r.err;  // 3: does not fit, still written
    return fs::exists(out) ? read(out).at("strategy").value("moe_dispatcher", std::string("alltoall")) : std::string();
  };
  const std::string moe = "--model qwen3-30b-a3b --cluster dgx-h100 --gpus 16 --ep 16 --zero 1 --global-batch 64";
  EXPECT_EQ(dispatcher_of(moe), "flex");
  EXPECT_EQ(dispatcher_of(moe + " --software pytorch-eager"), "alltoall");
  EXPECT_EQ(dispatcher_of(moe + " --moe-dispatcher alltoall"), "alltoall");
  EXPECT_EQ(dispatcher_of("--model llama2-7b --cluster dgx-h100 --gpus 8 --global-batch 64"), "alltoall");
  // Cross-node expert parallelism: flex sends each token over the network once per remote node,
  // alltoall every routed copy, so the default plan is the faster one.
  const fs::path a = dir_ / "a.json", b = dir_ / "b.json";
  ASSERT_EQ(run("predict " + moe + " --json " + a.string()).code, 0);
  ASSERT_EQ(run("predict " + moe + " --moe-dispatcher alltoall --json " + b.string()).code, 0);
  EXPECT_LT(read(a).at("time").at("step_s").get<double>(), read(b).at("time").at("step_s").get<double>());
  const fs::path found = dir_ / "search.json";
  ASSERT_EQ(run("search --model qwen3-30b-a3b --cluster dgx-h100 --gpus 16 --global-batch 64 --top 3 --json " +
                found.string()).code, 0);
  EXPECT_EQ(read(found).at("space").at("experts").at("moe_dispatcher"), "flex");
}

// The stacks that materialised the attention scores (megatron-lm-2021, megatron-deepspeed) run
// standard attention where --attention is not given; the flag still decides, and the others
// default to flash attention. Predict and search alike.
TEST_F(SearchCli, TheAttentionDefaultsToTheSoftwareProfiles) {
  auto attention_of = [&](const std::string& args) {
    const fs::path out = dir_ / "p.json";
    fs::remove(out);
    const Result r = run("predict --model gpt3-5b --cluster dgx-a100-80g --gpus 8 --tp 8 --global-batch 16 " + args +
                         " --json " + out.string());
    EXPECT_EQ(r.code, 0) << args << ": " << r.err;
    return fs::exists(out) ? read(out).at("strategy").at("attention").get<std::string>() : std::string();
  };
  EXPECT_EQ(attention_of("--software megatron-lm-2021"), "standard");
  EXPECT_EQ(attention_of("--software megatron-deepspeed"), "standard");
  EXPECT_EQ(attention_of("--software megatron-deepspeed --attention flash"), "flash");
  EXPECT_EQ(attention_of(""), "flash");
  const fs::path found = dir_ / "search.json";
  ASSERT_EQ(run("search --model gpt3-5b --cluster dgx-a100-80g --gpus 8 --global-batch 16 --top 1 --software "
                "megatron-lm-2021 --json " + found.string()).code, 0);
  EXPECT_EQ(read(found).at("space").at("attention"), "standard");
}

// More pipeline chunks than layers by one or two (Llama 3.1 405B's 126 layers over pp 16 x vp 8,
// as NVIDIA publishes it): without --pipeline-accounts the split counts the embedding and the loss
// (or the loss alone) as layers, says so in a note, and the plan records it; --pipeline-accounts
// none refuses the layout instead.
TEST_F(SearchCli, MoreChunksThanLayersCountTheEmbeddingAndTheLoss) {
  const fs::path out = dir_ / "p.json";
  const std::string layout = "predict --model llama3.1-405b --cluster gb200-nvl72 --gpus 256 --tp 4 --pp 16 --vp 8 "
                             "--zero 1 --sequence-parallel on --global-batch 1536 --seq 8192 --dtype mxfp8";
  const Result r = run(layout + " --json " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err,
            "trainplan predict: note: pp x vp (128) exceeds the model's 126 layers: the split counts the embedding and "
            "the loss as pipeline layers, as Megatron-core must to run it (--pipeline-accounts embedding,loss)\n");
  EXPECT_EQ(read(out).at("strategy").at("pipeline_accounts"), "embedding,loss");
  const Result explicit_none = run(layout + " --pipeline-accounts none");
  EXPECT_EQ(explicit_none.code, 2);
  EXPECT_NE(explicit_none.err.find("must not exceed the model's layers (126)"), std::string::npos) << explicit_none.err;
  // One chunk over: the loss alone.
  const Result one = run("predict --model llama3-8b --cluster dgx-h100 --gpus 3 --pp 3 --vp 11 --global-batch 66 --json " +
                         out.string());
  EXPECT_TRUE(one.code == 0 || one.code == 3) << one.err;
  EXPECT_EQ(read(out).at("strategy").at("pipeline_accounts"), "loss");
}

// Capacity for an MoE model: every size finds a layout, and MFU counts the FLOPs of the active
// parameters (Qwen3-30B-A3B: 3.3B activated of 30.5B, model card), not of every expert.
TEST_F(SearchCli, CapacityOfAnMoeModelCountsActiveParameters) {
  const fs::path out = dir_ / "capacity.json";
  const Result r = run("capacity --model qwen3-30b-a3b --tokens 1T --clusters dgx-h100 --gpus-range 16..64 --json " +
                       out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = read(out);
  ASSERT_EQ(j.at("options").size(), 3u);
  const double tokens_per_step = j.at("global_batch").get<double>() * j.at("seq_len").get<double>();
  for (const json& o : j.at("options")) {
    ASSERT_TRUE(o.at("feasible").get<bool>()) << o.at("gpus");
    const json& t = o.at("best").at("throughput");
    const double per_token = t.at("model_flops_per_step").get<double>() / tokens_per_step;
    // 6 x 3.3e9 for the active parameters' GEMMs, plus causal attention over 4096 tokens (scores
    // and values, 2 x 2 x 4096 x 4096 query width / 2 FLOPs a token and layer forward, x 3 with the
    // backward, x 48 layers: 4.8e9): between 1 and 1.6 x the first. Counting every expert would
    // give about 9 x.
    EXPECT_GT(per_token, 6 * 3.3e9) << o.at("gpus");
    EXPECT_LT(per_token, 1.6 * 6 * 3.3e9) << o.at("gpus");
    EXPECT_GT(o.at("mfu").get<double>(), 0.1);
    EXPECT_LT(o.at("mfu").get<double>(), 0.7);
  }
  // More GPUs finish sooner.
  EXPECT_GT(j.at("options")[0].at("days").get<double>(), j.at("options")[2].at("days").get<double>());
}

TEST_F(SearchCli, HelpNamesEveryFlag) {
  const Result s = run("search --help");
  ASSERT_EQ(s.code, 0);
  for (const char* f : {"--model", "--cluster", "--gpus", "--global-batch", "--seq", "--top", "--objective", "--dtype",
                        "--max-tp", "--max-pp", "--max-cp", "--max-dp", "--max-vp", "--max-micro-batch", "--zero",
                        "--recompute", "--schedules", "--exact-gpus", "--threads", "--pareto-window", "--json",
                        "--max-ep", "--etp", "--moe-imbalance", "--moe-dispatcher", "--moe-a2a-overlap",
                        "--capacity-factor", "--recompute-modules"}) {
    EXPECT_NE(s.out.find(f), std::string::npos) << f;
  }
  const Result c = run("capacity --help");
  ASSERT_EQ(c.code, 0);
  for (const char* f : {"--model", "--tokens", "--clusters", "--gpus-range", "--deadline-days", "--budget-usd",
                        "--global-batch", "--json", "--max-ep", "--etp", "--moe-imbalance", "--capacity-factor"}) {
    EXPECT_NE(c.out.find(f), std::string::npos) << f;
  }
}

}  // namespace

// Validation against the measured runs vTrain published (Bang et al. 2024, MICRO'24,
// arXiv:2312.12391; github.com/VIA-Research/vTrain data/, commit f8dda84; copied, unchanged but
// for a byte-order mark, into tests/data/published/vtrain/): GPT models trained with
// Megatron-DeepSpeed on A100s, each a layout sweep of one model on one cluster.
//   - multi-node: 109 runs of four models (3.6B, 18.4B, 39.1B, 175B) on 64 to 512 GPUs, 15 to 47
//     layouts each (tensor, data and pipeline parallelism and the micro-batch);
//   - single-node: 1,440 runs of eight small models (hidden 1024 or 2048, 12 to 24 layers,
//     sequence 1024) on 2, 4 and 8 GPUs of one node.
// Predicted as the CLI predicts them: software/megatron-deepspeed.json, the cluster the runs'
// configs state (tests/data/published/vtrain/vtrain-a100.json), --attention standard, full
// recompute (every run's use_checkpoint), fp16, ZeRO-1. The models: GPT-2's 50,257-token vocabulary
// (vTrain's default), a GeLU MLP of 4 x hidden, LayerNorm, learned positions, tied embeddings,
// dropout 0.1 (Megatron's defaults; the data states the shapes only).
//
// What was fitted: the profile's host time per kernel, on 128 single-node runs (host-bound: hidden
// 1024, tp 1, micro-batch 1; its host.source says how). The other single-node runs and every
// multi-node run were not fitted on. The profile's other departure from megatron-lm-2021, the
// backward's TP all-reduces behind the weight-gradient GEMMs, is read from the code.
//
// Tolerances: per model (and per single-node set of one model on one GPU count), Spearman >= 0.9
// between predicted and measured step times and a mean absolute error of at most 15%; at most 12%
// over each file; per multi-node model, the layout trainplan ranks first ran within 5% of the
// sweep's measured best. Models below the Spearman target today are listed in kKnownMisses with the floor
// they are held to (the target is NOT met for them), and each says whether a smooth function of the
// layout fitted to its measurements orders them past 0.9 (smooth_fit_ceiling; checked).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "rank_correlation.hpp"
#include "sim/cluster.hpp"
#include "sim/model_spec.hpp"
#include "sim/predict.hpp"
#include "sim/software.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

const std::string kDir = std::string(TRAINPLAN_TEST_DATA_DIR) + "/published/vtrain/";

// One measured run: the CSV's columns (the multi-node file has the parameter count first).
struct MeasuredRun {
  std::string model;  // "3.6B" (multi-node) or "h1024 l12" (single-node)
  int gpus, global_batch, micro_batch, hidden, heads, layers, seq, tp, dp, pp;
  double step_s;
};

std::vector<MeasuredRun> read_runs(const std::string& file, bool parameters_column) {
  std::ifstream in(kDir + file);
  EXPECT_TRUE(in) << kDir + file;
  std::vector<MeasuredRun> runs;
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    const std::size_t o = parameters_column ? 1 : 0;
    if (cells.size() != o + 11) {
      ADD_FAILURE() << file << ": " << line;
      continue;
    }
    auto i = [&](std::size_t k) { return std::stoi(cells[o + k]); };
    MeasuredRun r{"", i(0), i(1), i(2), i(3), i(4), i(5), i(6), i(7), i(8), i(9), std::stod(cells[o + 10]) / 1000};
    r.model = parameters_column ? cells[0] + "B" : fmt::format("h{} l{}", r.hidden, r.layers);
    runs.push_back(r);
  }
  return runs;
}

ModelSpec gpt_of(const MeasuredRun& r) {
  ModelSpec m;
  m.name = "gpt-" + r.model;
  m.layers = r.layers;
  m.hidden = r.hidden;
  m.heads = r.heads;
  m.kv_heads = r.heads;
  m.ffn_hidden = 4 * r.hidden;
  m.vocab = 50257;
  m.seq_len = r.seq;
  m.activation = Activation::gelu;
  m.norm = Norm::layernorm;
  m.position = Position::learned;
  m.tied_embeddings = true;
  m.dropout = 0.1;
  return m;
}

Strategy layout_of(const MeasuredRun& r) {
  Strategy s;
  s.tp = r.tp;
  s.pp = r.pp;
  s.dp = r.dp;
  s.zero = 1;
  s.micro_batch = r.micro_batch;
  s.global_batch = r.global_batch;
  s.seq_len = r.seq;
  s.recompute = Recompute::full;
  s.dtype = Dtype::fp16;
  s.attention = Attention::standard;
  return s;
}

struct Set {
  std::vector<double> predicted, measured;
  double rho() const { return testing::spearman(predicted, measured); }
  double mean_abs_error() const {
    double sum = 0;
    for (std::size_t i = 0; i < predicted.size(); ++i) sum += std::abs(predicted[i] / measured[i] - 1);
    return sum / static_cast<double>(predicted.size());
  }
};

// Predicted and measured step times grouped by `key` of each run.
template <typename Key>
std::map<std::string, Set> predict_runs(const std::vector<MeasuredRun>& runs, Key key) {
  const Cluster c = load_cluster(kDir + "vtrain-a100.json", TRAINPLAN_SOURCE_DIR);
  const Software sw = load_software("megatron-deepspeed", TRAINPLAN_SOURCE_DIR);
  std::map<std::string, Set> sets;
  for (const MeasuredRun& r : runs) {
    const Strategy s = layout_of(r);
    EXPECT_EQ(s.gpus(), r.gpus) << r.model;
    const Estimate e = predict(LayerGraph(gpt_of(r), r.seq), c, sw, s);
    Set& out = sets[key(r)];
    out.predicted.push_back(e.time.step);
    out.measured.push_back(r.step_s);
  }
  return sets;
}

// Models below the Spearman target today: the floor they are held to and what is not modelled.
const std::map<std::string, std::pair<double, const char*>> kKnownMisses = {
    {"175B",
     {0.8, "every run is predicted 6-15% slow and 17 of the 21 ran within 53.9-59.4 s: the tp 4 runs come out +8..+15% "
           "and the tp 8 runs +6..+12%, where the two fastest measured are tp 4 (pp 32 and 16), enough to swap "
           "neighbours; the slow bias is the A100 GEMM rate (tables derived from H100's) as on the other sets. A smooth "
           "function of the layout orders these runs (ceiling above 0.9): trainplan's miss"}},
    {"18.4B",
     {0.7, "every run within 16%, but ten of the fifteen ran within 9.6-11.0 s of each other: the tp 8 runs are "
           "predicted -7..+9% and the tp 1-4 runs -15..+10%, enough to swap neighbours. No smooth function of the "
           "layout orders these runs (ceiling below 0.9)"}},
    {"39.1B",
     {0.6, "the tp 2 runs with 8 or 16 pipeline stages ran 19-27 s where the tp 4 runs of the same stages and "
           "micro-batch ran 14.5-20.0 s and tp 1 with 16 stages 20.0 s; trainplan puts tp 2 between tp 1 and tp 4 "
           "(-8..-33%). Nothing in the layout explains a tp 2 slower than tp 1 (the node's measured 2-GPU all-reduce "
           "is as fast as its 4-GPU one); and the tp 8 runs are predicted 0-12% slow, more with larger micro-batches. "
           "No smooth function of the layout orders these runs (ceiling below 0.9)"}},
};

// Whether the measurements themselves are ordered by a smooth function of the layout: ln(step) fitted
// by least squares, on the runs themselves, with a quadratic in ln tp, ln pp and ln micro-batch and
// the 1F1B bubble share (pp - 1) / (m + pp - 1) -- 11 coefficients. The Spearman correlation of that
// fit with the measured steps bounds what a planner whose step time varies smoothly with the layout
// can reach; below 0.9 the order holds irregularities no such model reproduces.
double smooth_fit_ceiling(const std::vector<MeasuredRun>& runs) {
  constexpr std::size_t kTerms = 11;
  std::vector<std::array<double, kTerms>> x;
  std::vector<double> y, measured;
  for (const MeasuredRun& r : runs) {
    const double a = std::log(r.tp), b = std::log(r.pp), c = std::log(r.micro_batch);
    const double m = static_cast<double>(r.global_batch) / (r.dp * r.micro_batch);
    x.push_back({1, a, b, c, a * a, b * b, c * c, a * b, a * c, b * c, (r.pp - 1) / (m + r.pp - 1)});
    y.push_back(std::log(r.step_s));
    measured.push_back(r.step_s);
  }
  // Normal equations, solved by Gaussian elimination with partial pivoting.
  std::array<std::array<double, kTerms + 1>, kTerms> a{};
  for (std::size_t i = 0; i < x.size(); ++i)
    for (std::size_t j = 0; j < kTerms; ++j) {
      for (std::size_t k = 0; k < kTerms; ++k) a[j][k] += x[i][j] * x[i][k];
      a[j][kTerms] += x[i][j] * y[i];
    }
  for (std::size_t col = 0; col < kTerms; ++col) {
    std::size_t pivot = col;
    for (std::size_t r = col + 1; r < kTerms; ++r)
      if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
    std::swap(a[col], a[pivot]);
    for (std::size_t r = 0; r < kTerms; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (std::size_t k = col; k <= kTerms; ++k) a[r][k] -= f * a[col][k];
    }
  }
  std::vector<double> fitted;
  for (const auto& row : x) {
    double v = 0;
    for (std::size_t j = 0; j < kTerms; ++j) v += row[j] * a[j][kTerms] / a[j][j];
    fitted.push_back(v);
  }
  return testing::spearman(fitted, measured);
}

void check_models(const std::map<std::string, Set>& by_model, const char* what) {
  for (const auto& [model, set] : by_model) {
    const double rho = set.rho(), err = set.mean_abs_error();
    const auto miss = kKnownMisses.find(model);
    std::cout << fmt::format("{} {:10s} {:4d} runs  Spearman {:.3f}  mean abs. step error {:5.1f}%{}\n", what, model,
                             set.measured.size(), rho, 100 * err,
                             miss == kKnownMisses.end() ? "" : std::string("  KNOWN MISS: ") + miss->second.second);
    const double floor = miss == kKnownMisses.end() ? 0.9 : miss->second.first;
    EXPECT_GE(rho, floor) << model;
    EXPECT_LE(err, 0.15) << model;
  }
}

double overall_error(const std::map<std::string, Set>& sets) {
  double sum = 0, n = 0;
  for (const auto& [name, set] : sets) {
    sum += set.mean_abs_error() * static_cast<double>(set.measured.size());
    n += static_cast<double>(set.measured.size());
  }
  return sum / n;
}

TEST(ValidationVTrain, MultiNodeLayoutOrderPerModel) {
  const std::vector<MeasuredRun> runs = read_runs("ground_truth_multi.csv", true);
  ASSERT_EQ(runs.size(), 109u);
  const auto by_model = predict_runs(runs, [](const MeasuredRun& r) { return r.model; });
  ASSERT_EQ(by_model.size(), 4u);
  check_models(by_model, "multi-node ");
  // A known miss says whether the measured order is a smooth function of the layout; that is checked.
  std::map<std::string, std::vector<MeasuredRun>> runs_of;
  for (const MeasuredRun& r : runs) runs_of[r.model].push_back(r);
  for (const auto& [model, miss] : kKnownMisses) {
    const double ceiling = smooth_fit_ceiling(runs_of.at(model));
    std::cout << fmt::format("multi-node  {:10s} smooth-fit ceiling {:.3f}\n", model, ceiling);
    const bool data_limited = std::string(miss.second).find("ceiling below 0.9") != std::string::npos;
    EXPECT_EQ(ceiling < 0.9, data_limited) << model << ": " << ceiling;
  }
  // What a user of a planner acts on: the layout it ranks first. Its measured step against the
  // measured best of the sweep (0: trainplan picked the fastest run).
  for (const auto& [model, set] : by_model) {
    const double regret = testing::top_regret(set.predicted, set.measured, 1);
    std::cout << fmt::format("multi-node  {:10s} predicted-best layout ran {:.1f}% slower than the measured best (bound 5%)\n",
                             model, 100 * regret);
    EXPECT_LE(regret, 0.05) << model;
  }
  const double err = overall_error(by_model);
  std::cout << fmt::format("multi-node: mean absolute step error {:.1f}% over {} runs (bound 12%)\n", 100 * err, runs.size());
  EXPECT_LE(err, 0.12);
}

TEST(ValidationVTrain, SingleNodeLayoutOrderPerModelAndGpuCount) {
  const std::vector<MeasuredRun> runs = read_runs("ground_truth_single.csv", false);
  ASSERT_EQ(runs.size(), 1440u);
  check_models(predict_runs(runs, [](const MeasuredRun& r) { return r.model; }), "single-node");
  // One model on one cluster: each model on 2, 4 and 8 GPUs is a set of its own.
  const auto by_set = predict_runs(runs, [](const MeasuredRun& r) { return fmt::format("{} {} GPUs", r.model, r.gpus); });
  ASSERT_EQ(by_set.size(), 24u);
  int passing = 0;
  for (const auto& [set_name, set] : by_set) {
    EXPECT_GE(set.rho(), 0.9) << set_name;
    EXPECT_LE(set.mean_abs_error(), 0.15) << set_name;
    passing += set.rho() >= 0.9;
  }
  const double err = overall_error(by_set);
  std::cout << fmt::format("single-node: {} of {} sets at Spearman >= 0.9; mean absolute step error {:.1f}% over {} runs (bound 12%)\n",
                           passing, by_set.size(), 100 * err, runs.size());
  EXPECT_LE(err, 0.12);
}

}  // namespace
}  // namespace trainplan

// Runs of `trainplan exec` on CPU/Gloo for tests that compare layouts with the single-rank run:
// the run (losses, measurement JSON, parameter and first-step gradient dumps of every rank) and
// the tensor-by-tensor comparison with the single-rank run's dumps, as test_exec_equivalence.cpp
// does (same batch, seed, steps and tolerances).
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_fixture.hpp"

namespace trainplan::testing::exec_runs {

namespace fs = std::filesystem;

inline fs::path work_dir_path() { return fs::temp_directory_path() / ("trainplan_exec_runs_" + std::to_string(getpid())); }

inline fs::path work_dir() {
  fs::path d = work_dir_path();
  fs::create_directories(d);
  return d;
}

// The scratch folder of a test process goes when its tests end (ctest runs each test binary in
// its own process). Register once per binary: ::testing::AddGlobalTestEnvironment(new RemoveWorkDir).
class RemoveWorkDir : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(work_dir_path(), ec);
  }
};

inline std::string model_path(const std::string& name) {
  return std::string(TRAINPLAN_TEST_DATA_DIR) + "/exec/" + name + ".json";
}

// One rank's dump line: a tensor as that rank holds it.
struct Param {
  std::vector<int64_t> shape;
  int shard_dim = -1, tp_index = 0, tp = 1;
  std::vector<double> values;
};
using Dump = std::vector<std::pair<std::string, Param>>;

// Every rank's dump of one run, in rank order (a tensor replicated on several ranks appears once per rank).
inline Dump read_dumps(const fs::path& prefix, int ranks) {
  Dump out;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream f(prefix.string() + ".rank" + std::to_string(r));
    EXPECT_TRUE(f.good()) << "missing dump of rank " << r;
    std::string line;
    while (std::getline(f, line)) {
      std::istringstream ss(line);
      std::string name;
      Param p;
      size_t nd = 0, n = 0;
      ss >> name >> nd;
      p.shape.resize(nd);
      for (auto& d : p.shape) ss >> d;
      ss >> p.shard_dim >> p.tp_index >> p.tp >> n;
      p.values.resize(n);
      for (auto& v : p.values) ss >> v;
      out.emplace_back(name, std::move(p));
    }
  }
  return out;
}

struct ExecRun {
  int code = -1;
  std::vector<double> losses;
  Dump params, grads;  // parameters after the last step; reduced gradients of the first step
  nlohmann::json measurement;
  std::string output;
};

// `layout`: plan flags; `exec_flags`: flags of exec alone. fp32 unless the layout names a --dtype;
// global batch 4, micro-batch 1, 3 steps, no warm-up, seed 7 (the equivalence suite's run).
inline ExecRun exec_run(const std::string& model, int ranks, const std::string& layout, const std::string& tag,
                        const std::string& exec_flags = "") {
  const fs::path dir = work_dir();
  const fs::path json = dir / (tag + ".json"), dump = dir / (tag + ".params"), grads = dir / (tag + ".grads");
  const std::string dtype = layout.find("--dtype") == std::string::npos ? " --dtype fp32" : "";
  const std::string args = "exec --model " + model_path(model) + " --cluster dgx-h100" + dtype +
                           " --global-batch 4 --micro-batch 1 --steps 3 --warmup 0 --seed 7 --timeout 60 " + layout +
                           " " + exec_flags + (ranks > 1 ? " --nproc " + std::to_string(ranks) : "") + " --json " +
                           json.string() + " --dump-params " + dump.string() + " --dump-grads " + grads.string();
  const auto r = run_merged(args);
  ExecRun out;
  out.code = r.code;
  out.output = "trainplan " + args + "\n" + r.output;
  if (r.code != 0) return out;
  std::ifstream jf(json);
  out.measurement = nlohmann::json::parse(jf);
  for (const auto& s : out.measurement.at("steps")) out.losses.push_back(s.at("loss").get<double>());
  out.params = read_dumps(dump, ranks);
  out.grads = read_dumps(grads, ranks);
  return out;
}

inline bool close(double a, double b) { return std::fabs(a - b) <= 1e-4 * std::max(std::fabs(a), std::fabs(b)) + 1e-7; }

// The slice of the full tensor `full` that TP rank p.tp_index holds.
inline std::vector<double> tp_slice(const Param& full, const Param& p) {
  if (p.shard_dim < 0) return full.values;
  const int64_t rows = full.shape[0], cols = full.shape.size() > 1 ? full.shape[1] : 1;
  std::vector<double> out;
  if (p.shard_dim == 0) {
    const int64_t part = rows / p.tp;
    for (int64_t r = part * p.tp_index; r < part * (p.tp_index + 1); ++r)
      for (int64_t c = 0; c < cols; ++c) out.push_back(full.values[r * cols + c]);
  } else {
    const int64_t part = cols / p.tp;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = part * p.tp_index; c < part * (p.tp_index + 1); ++c) out.push_back(full.values[r * cols + c]);
  }
  return out;
}

// Every tensor of `got` (a layout's dumps) equals the matching slice of `ref` (the single-rank
// run's) to `tol` relative in the 2-norm, and every tensor of `ref` is held by some rank.
inline void expect_same_tensors(const Dump& ref, const Dump& got, double tol, const std::string& what,
                                const std::string& layout) {
  std::map<std::string, const Param*> full;
  for (const auto& [name, p] : ref) full[name] = &p;
  ASSERT_FALSE(full.empty()) << what;
  // The model's typical element magnitude (RMS over every reference tensor): a tensor near zero
  // (a bias after a few AdamW steps) is compared against that scale, not its own tiny norm, where
  // AdamW turns fp32 summation-order noise into a visible relative difference (layers.1.attn.bo
  // ran 1.05e-4 to 1.19e-4 relative against 1e-4 under CI load, with its gradients equal to 5e-7).
  // A wrong update is of the order of the learning rate per element and still fails.
  double all_sq = 0, all_n = 0;
  for (const auto& [name, p] : ref) {
    for (double v : p.values) all_sq += v * v;
    all_n += static_cast<double>(p.values.size());
  }
  const double rms = all_n > 0 ? std::sqrt(all_sq / all_n) : 0.0;
  std::map<std::string, int> seen;
  for (const auto& [name, p] : got) {
    auto it = full.find(name);
    ASSERT_NE(it, full.end()) << "tensor " << name << " is not in the single-rank model";
    ++seen[name];
    const std::vector<double> want = tp_slice(*it->second, p);
    ASSERT_EQ(want.size(), p.values.size()) << name;
    // Relative error of the tensor (this rank's shard) in the 2-norm. Not element by element:
    // AdamW divides each update by the gradient's own RMS, so an element whose gradient is a
    // near-cancellation turns fp32 summation-order noise into a visible step; the tensor as a
    // whole is still equal to 1e-4.
    double diff = 0, norm = 0;
    size_t worst = 0;
    for (size_t k = 0; k < want.size(); ++k) {
      const double d = p.values[k] - want[k];
      diff += d * d;
      norm += want[k] * want[k];
      if (std::fabs(d) > std::fabs(p.values[worst] - want[worst])) worst = k;
    }
    const double scale = std::max(std::sqrt(norm), rms * std::sqrt(static_cast<double>(want.size())));
    EXPECT_LE(std::sqrt(diff), tol * scale + 1e-12)
        << layout << ": " << what << " " << name << " (tp shard " << p.tp_index << ") differs from the single-rank run by "
        << std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30) << " relative; worst element " << worst << ": "
        << p.values[worst] << " vs " << want[worst];
  }
  EXPECT_EQ(seen.size(), full.size()) << layout << ": some " << what << " are held by no rank";
}

// The largest relative difference (2-norm, per tensor) between `got`'s tensors and the matching
// slices of `ref`'s.
inline double worst_relative_difference(const Dump& ref, const Dump& got) {
  std::map<std::string, const Param*> full;
  for (const auto& [name, p] : ref) full[name] = &p;
  double worst = 0;
  for (const auto& [name, p] : got) {
    auto it = full.find(name);
    if (it == full.end()) return INFINITY;
    const std::vector<double> want = tp_slice(*it->second, p);
    if (want.size() != p.values.size()) return INFINITY;
    double diff = 0, norm = 0;
    for (size_t k = 0; k < want.size(); ++k) {
      diff += (p.values[k] - want[k]) * (p.values[k] - want[k]);
      norm += want[k] * want[k];
    }
    worst = std::max(worst, std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30));
  }
  return worst;
}

// `got`'s losses step by step to 1e-4 relative, its first-step gradients to 1e-5 and its final
// parameters to 1e-4 equal the single-rank run `ref`'s.
inline void expect_equivalent(const ExecRun& ref, const ExecRun& got, const std::string& layout) {
  ASSERT_EQ(ref.losses.size(), 3u) << ref.output;
  ASSERT_EQ(got.losses.size(), 3u) << got.output;
  for (size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(close(got.losses[i], ref.losses[i]))
        << layout << ": step " << i << " loss " << got.losses[i] << " vs single rank " << ref.losses[i];
  expect_same_tensors(ref.grads, got.grads, 1e-5, "gradients (first step)", layout);
  expect_same_tensors(ref.params, got.params, 1e-4, "parameters", layout);
}

}  // namespace trainplan::testing::exec_runs

// trainplan exec's optimizer step (LibTorch's fused AdamW over the flat buffers' per-parameter
// views, exec/optimizer.cpp) against AdamW's formula, on CPU: one step from known parameters.
//
// AdamW (Loshchilov & Hutter 2019), first step t = 1 with bias correction: m = (1-b1) g,
// v = (1-b2) g^2, so m/(1-b1) / (sqrt(v/(1-b2)) + eps) = g / (|g| + eps), and
//   p1 = p0 (1 - lr wd [matrix]) - lr g / (|g| + eps)
// i.e. |p1 - p0 (1 - lr wd [matrix])| = lr wherever |g| >> eps, and less where |g| is near eps or
// zero (embedding rows of tokens the batch does not hold). Weight decay (wd = 0.1 in exec) applies
// to matrices only.
// The run with --lr 0 leaves the parameters at their initial values (p0).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using trainplan::testing::run_merged;

struct Dumped {
  std::vector<int64_t> shape;
  std::vector<double> values;
};

// Parameter dump of a one-rank run (--dump-params PREFIX writes PREFIX.rank0).
std::map<std::string, Dumped> one_step(const fs::path& dir, const std::string& tag, double lr) {
  const fs::path dump = dir / tag;
  const std::string args = "exec --model " + std::string(TRAINPLAN_TEST_DATA_DIR) +
                           "/exec/tiny-gpt.json --cluster dgx-h100 --dtype fp32 --global-batch 2 --micro-batch 1"
                           " --steps 1 --warmup 0 --seed 11 --gpus 1 --backend gloo --lr " +
                           std::to_string(lr) + " --dump-params " + dump.string();
  const auto r = run_merged(args);
  EXPECT_EQ(r.code, 0) << "trainplan " << args << "\n" << r.output;
  std::map<std::string, Dumped> out;
  std::ifstream f(dump.string() + ".rank0");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream ss(line);
    std::string name;
    size_t nd = 0, n = 0;
    int shard_dim = 0, tp_index = 0, tp = 0;
    Dumped d;
    ss >> name >> nd;
    d.shape.resize(nd);
    for (auto& x : d.shape) ss >> x;
    ss >> shard_dim >> tp_index >> tp >> n;
    d.values.resize(n);
    for (auto& v : d.values) ss >> v;
    out[name] = std::move(d);
  }
  return out;
}

TEST(ExecAdamW, FirstStepIsAdamWWithDecayOnMatricesOnly) {
  const fs::path dir = fs::temp_directory_path() / ("trainplan_exec_adamw_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const double lr = 0.05, wd = 0.1;  // wd: exec's AdamWSettings
  const auto p0 = one_step(dir, "p0", 0.0);
  const auto p1 = one_step(dir, "p1", lr);
  fs::remove_all(dir);
  ASSERT_FALSE(p0.empty());
  ASSERT_EQ(p0.size(), p1.size());
  // |p1 - p0 keep| = lr g/(|g| + eps) lies in [0, lr] and equals lr (to 1e-4 relative) wherever
  // |g| > 1e-4. The decay rule is told apart by counting the
  // elements that moved by exactly lr under it and under the opposite rule (which shifts each by
  // lr wd |p0|): the right rule must explain most elements and far more than the wrong one.
  auto moved_by_lr = [&](const Dumped& a, const Dumped& b, double keep) {
    size_t n = 0;
    for (size_t i = 0; i < a.values.size(); ++i)
      if (std::fabs(std::fabs(b.values[i] - a.values[i] * keep) - lr) <= 1e-4 * lr) ++n;
    return n;
  };
  int matrices = 0, vectors = 0;
  for (const auto& [name, a] : p0) {
    SCOPED_TRACE(name);
    const Dumped& b = p1.at(name);
    ASSERT_EQ(a.values.size(), b.values.size());
    const bool matrix = a.shape.size() >= 2;
    (matrix ? matrices : vectors) += 1;
    const double keep = 1 - (matrix ? lr * wd : 0.0), wrong_keep = 1 - (matrix ? 0.0 : lr * wd);
    double largest = 0;
    for (size_t i = 0; i < a.values.size(); ++i) {
      const double step = std::fabs(b.values[i] - a.values[i] * keep);
      EXPECT_LE(step, lr * (1 + 1e-5) + 1e-7) << "element " << i;  // |g| / (|g| + eps) < 1
      largest = std::max(largest, std::fabs(a.values[i]));
    }
    // Queries and keys of the freshly initialised model get gradients of 1e-8..1e-4 (nearly
    // uniform attention), too close to eps for their step to be lr: only the bound above applies.
    if (name.find("attn.wq") != std::string::npos || name.find("attn.wk") != std::string::npos ||
        name.find("attn.bq") != std::string::npos)
      continue;
    const size_t right = moved_by_lr(a, b, keep), wrong = moved_by_lr(a, b, wrong_keep), n = a.values.size();
    EXPECT_GE(right, n / 2) << right << " of " << n << " moved by lr";
    if (largest > 0) {
      EXPECT_GE(right, 4 * wrong + 1) << right << " moved by lr with " << name << "'s decay rule, " << wrong
                                      << " with the other";
    }
  }
  EXPECT_GT(matrices, 0);
  EXPECT_GT(vectors, 0);
}

}  // namespace

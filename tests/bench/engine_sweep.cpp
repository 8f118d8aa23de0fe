// How far the two time engines are apart over the whole space search considers, for every shipped
// model, cluster and software profile, in bf16, fp16, fp8 and fp32, with flash and standard
// attention: `make sweep-engines` (about a minute on two cores). For each combination it takes a
// fixed sample of up to 40 layouts of default_space (64 GPUs, 4 on cpu-local; global batch 256;
// the model's sequence, at most 8192), costs each once (step_costs) and times it with the closed
// form (compose) and the step simulator (simulate), and prints how many differ by more than 2%, 5%
// and 10%, the range of simulated / analytic - 1, and the layouts past 10%. A combination a
// cluster cannot run (a dtype without a peak there) is skipped. Models with experts are swept over
// every expert layout search enumerates, with the default expert settings and again with an
// imbalanced (1.5), overlapped all-to-all and the module sets search tries by default; their
// spread is printed apart, 1F1B and interleaved.
// Not a test: the bounds the project holds the engines to are in tests/sim/test_engine_agreement.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "sim/check.hpp"
#include "sim/cluster.hpp"
#include "sim/model_spec.hpp"
#include "sim/predict.hpp"
#include "sim/schedule.hpp"
#include "sim/search.hpp"
#include "sim/simulate.hpp"
#include "sim/software.hpp"
#include "sim/strategy.hpp"

using namespace trainplan;

int main() {
  const std::filesystem::path root = TRAINPLAN_SOURCE_DIR;
  std::vector<std::string> models;
  for (const auto& e : std::filesystem::directory_iterator(root / "models")) models.push_back(e.path().stem().string());
  std::sort(models.begin(), models.end());
  const std::vector<std::string> clusters{"dgx-h100", "dgx-h200", "dgx-a100-80g", "dgx-a100-40g", "pcie-l40s-8", "cpu-local"};
  const std::vector<std::string> profiles{"megatron-core", "pytorch-eager", "trainplan-exec", "llm-foundry"};
  std::mt19937 rng(1);  // fixed: the same sample every run
  long compared = 0, past2 = 0, past5 = 0, past10 = 0;
  double lo = 0, hi = 0;
  std::map<std::string, int> past10_by;  // cluster and schedule of the layouts past 10%
  long moe_compared[2] = {0, 0}, moe_past3[2] = {0, 0};  // models with experts: [1F1B, interleaved]
  double moe_lo[2] = {0, 0}, moe_hi[2] = {0, 0};
  ExpertSpace overlapped;
  overlapped.moe_imbalance = 1.5;
  overlapped.moe_a2a_overlap = true;
  for (const std::string& model : models) {
    const ModelSpec m = load_model(model, root);
    const int seq = std::min(m.seq_len, 8192);
    const LayerGraph g(m, seq);
    for (const std::string& cluster : clusters) {
      const Cluster c = load_cluster(cluster, root);
      for (const std::string& profile : profiles) {
        const Software sw = load_software(profile, root);
        for (Dtype dtype : {Dtype::bf16, Dtype::fp8, Dtype::fp32, Dtype::fp16}) {
          for (int variant = 0; variant < 4; ++variant) {
            const Attention attention = variant % 2 ? Attention::standard : Attention::flash;
            if (variant >= 2 && (!m.moe.on() || dtype == Dtype::fp16)) continue;  // (fp16: no ep > 1)
            SearchSpace space = default_space(c, cluster == "cpu-local" ? 4 : 64, 256, seq, attention);
            space.dtype = dtype;
            if (variant >= 2) space.experts = overlapped;
            if (variant >= 2) space.experts.recompute_modules = recomputable_modules(m);  // search's default
            std::vector<Strategy> layouts;
            try {
              layouts = enumerate_space(g, c, space);
            } catch (const InputError&) {
              continue;  // e.g. no fp8 peak on this GPU
            }
            std::shuffle(layouts.begin(), layouts.end(), rng);
            if (layouts.size() > 40) layouts.resize(40);
            for (const Strategy& s : layouts) {
              if (simulated_slots(s) > 20000) continue;
              const StepCosts costs = step_costs(g, c, sw, s);
              const Seconds analytic = compose(costs, g, c, s).time.step;
              if (!(analytic > 0)) continue;
              const double d = simulate(costs, schedule_for(s), Record::usage).step / analytic - 1;
              ++compared;
              lo = std::min(lo, d);
              hi = std::max(hi, d);
              past2 += std::abs(d) > 0.02;
              if (m.moe.on()) {
                const int k = s.schedule == ScheduleKind::interleaved;
                ++moe_compared[k];
                moe_past3[k] += std::abs(d) > 0.03;
                moe_lo[k] = std::min(moe_lo[k], d);
                moe_hi[k] = std::max(moe_hi[k], d);
              }
              past5 += std::abs(d) > 0.05;
              if (std::abs(d) > 0.10) {
                ++past10;
                ++past10_by[cluster + " " + to_string(s.schedule)];
                std::printf("%+6.1f%%  %s on %s, %s, %s: %s\n", 100 * d, model.c_str(), cluster.c_str(), profile.c_str(),
                            to_string(dtype), describe(s).c_str());
              }
            }
          }
        }
      }
    }
  }
  std::printf("%ld layouts: past 2%% %ld, past 5%% %ld, past 10%% %ld; simulated vs analytic %+.1f%% to %+.1f%%\n",
              compared, past2, past5, past10, 100 * lo, 100 * hi);
  for (const auto& [what, n] : past10_by) std::printf("  past 10%%: %d on %s\n", n, what.c_str());
  for (int k : {0, 1}) {
    std::printf("models with experts, %s: %ld layouts, past 3%% %ld; simulated vs analytic %+.1f%% to %+.1f%%\n",
                k ? "interleaved" : "1f1b", moe_compared[k], moe_past3[k], 100 * moe_lo[k], 100 * moe_hi[k]);
  }
  return 0;
}

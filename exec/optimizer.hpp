// The optimizer side of a rank's step: AdamW over shards of flat parameter buffers, and fp16's
// dynamic loss scaling. The DP reducer (reducer.hpp) steps its shard (or the whole chunk) with it,
// a parameter server (param_server.hpp) its server shard.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "exec/model.hpp"

namespace trainplan::exec {

// AdamW (Loshchilov & Hutter 2019) with decoupled weight decay on matrices only; constant rate.
struct AdamWSettings {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// AdamW over shards of flat parameter buffers, by LibTorch's fused multi-tensor kernel. Weight
// decay on matrices only (ParamInfo::decay).
class ShardAdamW {
 public:
  explicit ShardAdamW(AdamWSettings a);
  ~ShardAdamW();
  // Adds the elements [lo, lo + master.numel()) of a flat buffer laid out as `params`: `master`
  // (the weights it updates), `grad`, `exp_avg` and `exp_avg_sq` are buffers of that length.
  // Elements of no parameter (the buffer's padding) are left alone.
  void add(const std::vector<ParamInfo>& params, int64_t lo, const at::Tensor& master, const at::Tensor& grad,
           const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq);
  void step();  // one AdamW step over everything added

 private:
  struct Group;
  AdamWSettings adam_;
  std::vector<Group> groups_;  // with weight decay, without
  at::Tensor step_;            // optimizer steps taken (fp32 scalar on the device)
};

// Dynamic loss scaling for fp16 (Micikevicius et al. 2018, "Mixed Precision Training", sec. 3.2;
// the schedule of PyTorch's torch.amp.GradScaler): the loss is multiplied by `scale` before the
// backward; a step whose gradients hold an inf or NaN on any rank is skipped and the scale
// multiplied by `backoff`; after `growth_interval` good steps in a row it is multiplied by
// `growth`. Defaults are GradScaler's (init 2^16, growth 2, backoff 0.5, interval 2000).
struct LossScaling {
  bool enabled = false;
  double scale = 65536.0;
  double growth = 2.0, backoff = 0.5;
  int growth_interval = 2000;
  int good_steps = 0;               // good steps since the last change
  std::vector<int> skipped;         // step indices skipped (inf/NaN gradients)

  // Step `step`'s verdict: `finite` (every rank's gradients finite) keeps the step and counts it
  // towards growth; else the step is recorded as skipped and the scale backs off. Returns `finite`.
  // The scale that unscales this step's gradients must be read before the call.
  bool record(int step, bool finite) {
    if (!finite) {
      skipped.push_back(step);
      scale *= backoff;
      good_steps = 0;
      return false;
    }
    if (++good_steps == growth_interval) {
      scale *= growth;
      good_steps = 0;
    }
    return true;
  }
};

}  // namespace trainplan::exec

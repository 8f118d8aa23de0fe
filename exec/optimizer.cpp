// AdamW over shards of flat buffers by LibTorch's fused multi-tensor kernel (see optimizer.hpp).
#include "exec/optimizer.hpp"

#include <ATen/ops/_fused_adamw.h>

#include <algorithm>

namespace trainplan::exec {

// The optimizer's view of the shards: per parameter (or the part of it in the shard), 1-D views
// of master weights, gradients and both moments, in two groups (with and without weight decay)
// that at::_fused_adamw_ updates in one multi-tensor launch each.
struct ShardAdamW::Group {
  double weight_decay = 0;
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
};

ShardAdamW::ShardAdamW(AdamWSettings a) : adam_(a) {}
ShardAdamW::~ShardAdamW() = default;

void ShardAdamW::add(const std::vector<ParamInfo>& params, int64_t lo, const at::Tensor& master,
                     const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) {
  if (groups_.empty()) {
    groups_.resize(2);
    groups_[0].weight_decay = adam_.weight_decay;  // matrices
    groups_[1].weight_decay = 0;                   // vectors (norms, biases)
    // The step count the fused kernel reads (fp32, on the parameters' device), incremented on
    // the device before each update as torch.optim.AdamW(fused=True) does.
    step_ = at::zeros({}, master.options().dtype(at::kFloat));
  }
  // Intersect each parameter's element range with the shard; the padding at the end of the flat
  // buffer belongs to no parameter and stays zero.
  const int64_t hi = lo + master.numel();
  for (const ParamInfo& p : params) {
    const int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
    if (b >= e) continue;
    Group& g = groups_[p.decay ? 0 : 1];
    g.params.push_back(master.narrow(0, b - lo, e - b));
    g.grads.push_back(grad.narrow(0, b - lo, e - b));
    g.exp_avgs.push_back(exp_avg.narrow(0, b - lo, e - b));
    g.exp_avg_sqs.push_back(exp_avg_sq.narrow(0, b - lo, e - b));
    g.steps.push_back(step_);
  }
}

void ShardAdamW::step() {
  // AdamW (Loshchilov & Hutter 2019, Algorithm 2) by LibTorch's fused multi-tensor kernel, on
  // CUDA and CPU alike: p <- p (1 - lr wd); m <- b1 m + (1 - b1) g; v <- b2 v + (1 - b2) g^2;
  // p <- p - lr/(1 - b1^t) * m / (sqrt(v)/sqrt(1 - b2^t) + eps). No temporaries the size of the
  // parameters, no host synchronisation (the step count lives on the device).
  torch::NoGradGuard ng;
  if (groups_.empty()) return;
  step_.add_(1);
  for (Group& g : groups_) {
    if (g.params.empty()) continue;
    at::_fused_adamw_(g.params, g.grads, g.exp_avgs, g.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, g.steps, adam_.lr,
                      adam_.beta1, adam_.beta2, g.weight_decay, adam_.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
}

}  // namespace trainplan::exec

// Test-only fault injection (see faults.hpp).
#include "exec/faults.hpp"

#include <torch/torch.h>

#include <csignal>
#include <limits>
#include <unistd.h>

#include "exec/reducer.hpp"

namespace trainplan::exec {

namespace {

// The faults the --fault-* flags ask of one rank.
class TestFaults final : public FaultInjector {
 public:
  TestFaults(const FaultOptions& fault, int rank, double loss_factor)
      : fault_(fault), rank_(rank), loss_factor_(loss_factor) {}

  // Acts once, after the first forward of `fault.step`: kill, hang, or (on its device, through the
  // real allocator) a request for 4 PiB, which no machine has.
  void after_forward(int step, const at::Tensor& output) override {
    if (step != fault_.step || forward_done_) return;
    forward_done_ = true;
    if (rank_ == fault_.kill_rank) ::kill(::getpid(), SIGKILL);
    if (rank_ == fault_.hang_rank)
      for (;;) ::pause();
    if (rank_ == fault_.alloc_rank) {
      at::Tensor too_big = at::empty({int64_t(1) << 52}, output.options().dtype(at::kByte));
      (void)too_big;
    }
  }

  void before_backward(int, at::Tensor& objective) override {
    if (loss_factor_ != 1) objective = objective * loss_factor_;
  }

  // The chunk of the first backward of `fault.step` on the NaN rank gets a NaN gradient, written
  // just before the optimizer reads it (no reduction is in flight on the buffer then); checks that
  // the fp16 loss scaler skips the step.
  void after_backward(int step, int chunk) override {
    if (step == fault_.step && rank_ == fault_.nan_rank && !backward_done_) poisoned_chunk_ = chunk;
    if (step == fault_.step) backward_done_ = true;
  }
  void before_update(int, DpReducer& dp) override {
    if (poisoned_chunk_ < 0) return;
    torch::NoGradGuard ng;
    dp.shard_grad(poisoned_chunk_).narrow(0, 0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
    poisoned_chunk_ = -1;
  }

 private:
  FaultOptions fault_;
  int rank_;
  double loss_factor_;
  bool forward_done_ = false, backward_done_ = false;
  int poisoned_chunk_ = -1;
};

}  // namespace

std::unique_ptr<FaultInjector> make_fault_injector(const FaultOptions& fault, int rank, int micro_batches, int dp) {
  // The gradient-scale bug: the loss (and so every gradient) multiplied by what the mean's divisor
  // leaves out, the DP ranks or the micro-batches.
  const double loss_factor = fault.grad_bug == FaultOptions::GradBug::sum_dp              ? dp
                             : fault.grad_bug == FaultOptions::GradBug::sum_micro_batches ? micro_batches
                                                                                          : 1;
  const bool here = fault.step >= 0 && (rank == fault.kill_rank || rank == fault.hang_rank ||
                                        rank == fault.alloc_rank || rank == fault.nan_rank);
  if (!here && loss_factor == 1) return std::make_unique<FaultInjector>();
  return std::make_unique<TestFaults>(fault, rank, loss_factor);
}

}  // namespace trainplan::exec

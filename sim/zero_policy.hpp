// ZeroPolicy: what a ZeRO stage (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
// Training Trillion Parameter Models", Sec. 5 and Fig. 1) does to one data-parallel group, as named
// facts. The stage number lives in files, flags and reports; every component that behaves
// differently by stage (cost model, memory model, simulator, search bounds, executor) asks one of
// these questions instead of comparing the number. PlanShape (plan_shape.hpp) carries one.
//
//   stage  optimizer states  gradients                     parameters
//   0      replicated        all-reduced once a step        replicated
//   1      sharded (1/N)     reduce-scattered once a step   replicated; shards all-gathered after the step
//   2      sharded           reduce-scattered every micro-batch, 1/N kept; shards gathered after the step
//   3      sharded           reduce-scattered every micro-batch, 1/N kept; sharded, each unit gathered
//                                                           before its forward and again before its backward
#pragma once

namespace trainplan {

struct ZeroPolicy {
  int stage = 0;                          // 0..3: for files and display; behaviour reads the fields below
  bool shards_optimizer = false;          // fp32 master weights and Adam moments: 1/N of them per rank
  bool shards_grads = false;              // each rank keeps 1/N of the (reduced) gradients
  bool shards_params = false;             // each rank keeps 1/N of the weights; units are gathered to run
  bool reduce_scatters = false;           // the gradient reduction is a reduce-scatter (else an all-reduce)
  bool reduce_each_micro_batch = false;   // gradients leave the GPU after every micro-batch's backward
  bool gather_params_after_step = false;  // updated shards are all-gathered after the optimizer step

  static constexpr int kMaxStage = 3;
  static constexpr bool valid_stage(int stage) { return stage >= 0 && stage <= kMaxStage; }

  // The policy of a stage; `stage` must satisfy valid_stage (loaders and validate() check it first).
  static constexpr ZeroPolicy of(int stage) {
    ZeroPolicy z;
    z.stage = stage;
    z.shards_optimizer = stage >= 1;
    z.shards_grads = stage >= 2;
    z.shards_params = stage >= 3;
    z.reduce_scatters = stage >= 1;
    z.reduce_each_micro_batch = stage >= 2;
    z.gather_params_after_step = stage == 1 || stage == 2;
    return z;
  }
  bool operator==(const ZeroPolicy&) const = default;
};

}  // namespace trainplan

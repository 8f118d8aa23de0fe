// goodput: what failures cost a training run. First-order checkpoint/restart model (Young 1974,
// "A first order approximation to the optimum checkpoint interval", CACM 17(9); Daly 2006, FGCS
// 22(3)), per option of a capacity plan:
//   M  = job MTBF (s) = MTBF of one GPU / GPUs (failures independent, any one stops the job)
//   C  = checkpoint write time (s) = checkpoint bytes / (write bandwidth per GPU x GPUs); the
//        checkpoint holds one copy of the model states a restart needs: parameters x (weight +
//        optimizer bytes per parameter) (plan_shape.hpp's state_bytes; gradients are not saved)
//   R  = restart (s) = detection, rescheduling and re-initialisation + reading the checkpoint back
//        at the write bandwidth
//   tau = checkpoint interval (work between checkpoints, s) = sqrt(2 C M)   (Young/Daly)
// Wall time T for useful work W: T = W (1 + C / tau) + (T / M) (R + (tau + C) / 2), a failure
// losing half an interval and its checkpoint on average, so
//   goodput = W / T = (1 - (R + (tau + C) / 2) / M) / (1 + C / tau)      (0 when the bracket <= 0)
// and per day of wall time: failures 86400 / M, lost work failures x (tau + C) / 2, restarts
// failures x R, checkpointing useful x C / tau, useful 86400 x goodput (the four add up to a day).
// Failure-aware time, cost and energy are the failure-free ones / goodput (GPUs are paid and
// powered while they restart and redo work).
#pragma once
#include <filesystem>
#include <string>

#include "sim/layer_graph.hpp"
#include "sim/strategy.hpp"
#include "sim/units.hpp"

namespace trainplan {

struct Reliability {
  std::string source;                  // where the defaults come from
  double mtbf_gpu_hours = 0;           // mean time between job-stopping failures of one GPU, hours
  BytesPerSecond checkpoint_per_gpu = 0;  // checkpoint write (and read) bandwidth per GPU
  Seconds restart = 0;                 // detection + rescheduling + re-initialisation
};

// Bounds of the three figures, for reliability files and capacity's --mtbf-hours,
// --checkpoint-gbps and --restart-minutes alike: a failure every 3.6 s to one per 10^8 years,
// 1 KB/s to 1 PB/s per GPU, and restarts up to ~2 years. Beyond them the figures overflow.
inline constexpr double kMtbfHoursMin = 1e-3, kMtbfHoursMax = 1e12;
inline constexpr double kCheckpointGbpsMin = 1e-6, kCheckpointGbpsMax = 1e6;
inline constexpr double kRestartMinutesMax = 1e6;

// reliability/<name>.json under data_dir, or a path; throws InputError naming file and field.
Reliability load_reliability(const std::string& name_or_path, const std::filesystem::path& data_dir);

// Bytes of one checkpoint of `s`'s model states (see above).
Bytes checkpoint_bytes(const LayerGraph& graph, const Strategy& s);

struct Goodput {
  Seconds job_mtbf = 0;
  Bytes checkpoint = 0;
  Seconds checkpoint_write = 0;     // C
  Seconds interval = 0;             // tau (Young/Daly)
  double interval_steps = 0;        // tau / step time
  Seconds restart = 0;              // R, the checkpoint read included
  double failures_per_day = 0;
  Seconds lost_work_per_day = 0;
  Seconds restart_per_day = 0;
  Seconds checkpoint_per_day = 0;
  double goodput = 0;               // useful share of wall time, in [0, 1]
};

// The goodput of a job of `gpus` GPUs with step time `step` and checkpoint of `checkpoint` bytes.
Goodput goodput(const Reliability& r, int gpus, Bytes checkpoint, Seconds step);

}  // namespace trainplan

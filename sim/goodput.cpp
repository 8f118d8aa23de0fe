#include "sim/goodput.hpp"

#include <algorithm>
#include <cmath>

#include "sim/json_reader.hpp"
#include "sim/memory_model.hpp"

namespace trainplan {

Reliability load_reliability(const std::string& name_or_path, const std::filesystem::path& data_dir) {
  std::filesystem::path path = name_or_path;
  if (name_or_path.find('/') == std::string::npos && path.extension() != ".json") {
    path = data_dir / "reliability" / (name_or_path + ".json");
  }
  const std::string file = path.string();
  const nlohmann::json j = read_json_file(path);
  JsonObject o(j, file);
  if (o.string("schema") != "trainplan/reliability/v1") throw o.error("schema", "must be trainplan/reliability/v1");
  o.string("name");
  Reliability r;
  r.source = o.string("source");
  r.mtbf_gpu_hours = o.number("mtbf_gpu_hours", kMtbfHoursMin, kMtbfHoursMax);
  r.checkpoint_per_gpu = o.number("checkpoint_gbps_per_gpu", kCheckpointGbpsMin, kCheckpointGbpsMax) * kGB;
  r.restart = o.number("restart_minutes", 0, kRestartMinutesMax) * 60.0;
  o.finish();
  return r;
}

Bytes checkpoint_bytes(const LayerGraph& graph, const Strategy& s) {
  const StateBytes b = state_bytes(s);
  return graph.total_params() * (b.weight + b.optimizer);
}

Goodput goodput(const Reliability& r, int gpus, Bytes checkpoint, Seconds step) {
  Goodput g;
  const double M = r.mtbf_gpu_hours * 3600.0 / gpus;
  const double C = checkpoint / (r.checkpoint_per_gpu * gpus);
  g.job_mtbf = M;
  g.checkpoint = checkpoint;
  g.checkpoint_write = C;
  g.restart = r.restart + C;  // the checkpoint is read back at the write bandwidth
  g.interval = std::sqrt(2 * C * M);
  g.interval_steps = step > 0 ? g.interval / step : 0;
  const double lost = (g.interval + C) / 2;
  const double bracket = 1 - (g.restart + lost) / M;
  g.goodput = bracket > 0 && g.interval > 0 ? bracket / (1 + C / g.interval) : 0.0;
  g.failures_per_day = 86400.0 / M;
  g.lost_work_per_day = g.failures_per_day * lost;
  g.restart_per_day = g.failures_per_day * g.restart;
  g.checkpoint_per_day = 86400.0 * g.goodput * (g.interval > 0 ? C / g.interval : 0.0);
  return g;
}

}  // namespace trainplan

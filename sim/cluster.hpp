// Cluster: one kind of GPU cluster, loaded from topologies/<name>.json. Units are converted at load
// (GB -> bytes, GB/s -> bytes/s, TFLOP/s -> FLOP/s, us -> s); nothing downstream sees file units.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/op_costs.hpp"
#include "sim/units.hpp"

namespace trainplan {

struct GpuSpec {
  std::string name;
  FlopsPerSecond peak_bf16 = 0, peak_fp16 = 0, peak_fp8 = 0, peak_fp32 = 0;  // dense; 0 = unsupported
  Bytes hbm = 0;
  BytesPerSecond hbm_bandwidth = 0;

  FlopsPerSecond peak(Dtype d) const;
};

// One level of interconnect. Bandwidth is per GPU and per direction.
struct LinkTier {
  std::string name;
  int span_gpus = 0;          // largest group of GPUs this tier connects at full bandwidth
  BytesPerSecond bandwidth = 0;
  Seconds latency = 0;
  double efficiency = 1;      // achieved bus bandwidth / link bandwidth for large messages
};

// How collectives behave beyond latency x steps + bytes / bandwidth (collectives.hpp).
struct CollectiveCosts {
  Seconds call_overhead = 0;        // fixed cost of issuing one collective (launch, proxy, sync)
  double overlap_slowdown = 0;      // compute slowdown while a collective overlaps it, as a share
                                    // of the overlapped communication time (SM and HBM contention)
};

inline constexpr const char* kClusterSchema = "trainplan/cluster/v2";

struct Cluster {
  std::string name;
  std::string source;
  std::string calibration;    // what in the file was measured, fitted or assumed, and on what
  GpuSpec gpu;
  OpCostTables ops;           // kernel times of this GPU: measured, or derived (op_costs.hpp)
  CollectiveCosts collectives;
  int gpus_per_node = 1;
  LinkTier node;              // intra-node (NVLink/NVSwitch, PCIe, or loopback)
  std::vector<LinkTier> network;  // scale-out tiers, innermost first; the last one spans the cluster
  Bytes runtime_overhead = 0; // per GPU: CUDA context, communication buffers, allocator slack
  double price_per_gpu_hour = 0;  // USD
  double power_per_gpu = 0;       // W, GPU plus its share of the node and network

  int max_gpus() const;
};

// `data_dir` finds the built-in cluster a derived file's "ops.derive.from" names (empty: only
// files can be named).
Cluster parse_cluster(const nlohmann::json& j, const std::string& file, const std::filesystem::path& data_dir = {});
// `name_or_path` is a built-in name (topologies/<name>.json under data_dir) or a path.
Cluster load_cluster(const std::string& name_or_path, const std::filesystem::path& data_dir);
// Names of the built-in clusters (file stems under data_dir/topologies), sorted.
std::vector<std::string> builtin_clusters(const std::filesystem::path& data_dir);

}  // namespace trainplan

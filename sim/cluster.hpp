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
  // Block-scaled formats with hardware scale handling (Blackwell tensor cores): MXFP8 (OCP MX v1.0,
  // 32-element blocks, E8M0 scales) and NVFP4 (16-element blocks, E4M3 scales). Optional in the
  // file; 0 = the GPU has no such arithmetic.
  FlopsPerSecond peak_mxfp8 = 0, peak_nvfp4 = 0;
  Bytes hbm = 0;
  BytesPerSecond hbm_bandwidth = 0;
  // Streaming multiprocessors (NVIDIA) or compute units (AMD): what a GEMM's tiles are spread over.
  // Optional in the file ("sm_count"); 0 = not stated. Deriving op tables uses it (op_costs.hpp).
  int sm_count = 0;

  FlopsPerSecond peak(Dtype d) const;
};

// One level of interconnect. Bandwidth is per GPU and per direction.
struct LinkTier {
  std::string name;
  int span_gpus = 0;          // largest group of GPUs this tier connects at full bandwidth
  BytesPerSecond bandwidth = 0;
  Seconds latency = 0;
  double efficiency = 1;      // achieved bus bandwidth / link bandwidth for large messages
  // The tier's switches reduce in the network (InfiniBand SHARP, NCCL's CollNet algorithms): an
  // all-reduce over it sends each byte up once and receives the result once (collectives.hpp).
  // Optional in the file ("in_network_reduction", default false): NCCL uses it only with the
  // SHARP plugin and NCCL_COLLNET_ENABLE=1, so a cluster file says so where its jobs run that way.
  bool in_network_reduction = false;
};

// The all-reduce bus bandwidth NCCL reached over a whole node by message size (nccl-tests
// all_reduce_perf on all of a node's GPUs): below the link's large-message rate at mid sizes
// (fewer channels, protocol changes), which latency x steps + bytes / (bandwidth x efficiency)
// does not follow. Points ascending in bytes; empty: the formula alone. A ring's curve: a node
// with in-switch reduction (NVLS) may not state one.
struct BusBandwidthCurve {
  std::vector<Bytes> bytes;
  std::vector<BytesPerSecond> bus_bandwidth;
  // At message size m: log-log interpolation; below the first point the first point's time (the
  // bus bandwidth falls with m), above the last the last point's bus bandwidth.
  BytesPerSecond at(Bytes m) const;
  bool empty() const { return bytes.empty(); }
};

// How collectives behave beyond latency x steps + bytes / bandwidth (collectives.hpp).
struct CollectiveCosts {
  Seconds call_overhead = 0;        // fixed cost of issuing one collective (launch, proxy, sync)
  double overlap_slowdown = 0;      // compute slowdown while a collective overlaps it, as a share
                                    // of the overlapped communication time (SM and HBM contention)
};

// In-switch reduction over the scale-up domain (NVLink SHARP, "NVLS" in NCCL): the switch reduces
// and multicasts, so an all-reduce moves (1 + 1/n) x the message through each GPU's link each way
// instead of the ring's 2 (n-1)/n (collectives.hpp). `efficiency` is the achieved share of the node
// link's bandwidth under that algorithm (lower than the ring's: switch arithmetic and multicast).
struct InSwitchReduction {
  double efficiency = 0;      // 0: the domain has no in-switch reduction
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
  // Measured node all-reduces (optional, "node.measured_all_reduce"): ring collectives of groups
  // inside one node take their bus bandwidth from it (collectives.hpp).
  BusBandwidthCurve node_all_reduce;
  // The scale-up domain: consecutive GPUs (whole nodes) that reach each other over the node link
  // at its full per-GPU bandwidth, e.g. 72 on a GB200 NVL72 rack of 4-GPU trays (NVLink switch
  // trays); gpus_per_node where the node link ends at the node. Network tiers span whole domains.
  int scale_up_gpus = 1;
  InSwitchReduction in_switch_reduction;  // NVLink SHARP inside the domain (none: efficiency 0)
  // A node without a switch whose GPUs are fully connected by one link per pair (AMD Infinity
  // Fabric / xGMI): that link's bandwidth per direction. A group of n GPUs of one node then
  // reaches n - 1 links, not node.bandwidth (the sum over all 7 peers of an 8-GPU node); 0 for
  // switched nodes (NVSwitch), where every group gets the whole per-GPU bandwidth.
  BytesPerSecond peer_link_bandwidth = 0;
  std::vector<LinkTier> network;  // scale-out tiers, innermost first; the last one spans the cluster
  Bytes runtime_overhead = 0; // per GPU: CUDA context, communication buffers, allocator slack
  double price_per_gpu_hour = 0;  // USD
  double power_per_gpu = 0;       // W, GPU plus its share of the node and network

  int max_gpus() const;
};

// Whether the cluster's "GPU" is a CPU host, as `trainplan calibrate --cpu` writes one (cpu-local):
// op tables measured in fp32 on a device with no 16-bit arithmetic (bf16 and fp16 peaks 0). A
// cluster file has no device field, and every GPU states a bf16 or fp16 peak. A GPU's tables are
// never derived from a CPU's: the rule assumes the same kernels at the same fraction of peak.
bool is_cpu_host(const Cluster& c);

// Why a GPU's tables cannot be derived from `src` ("" where they can): its own tables are derived,
// or it is a CPU host. The one rule of `cluster derive --from` and of a file's "ops.derive.from".
std::string not_a_derivation_source(const Cluster& src);

// `data_dir` finds the built-in cluster a derived file's "ops.derive.from" names (empty: only
// files can be named).
Cluster parse_cluster(const nlohmann::json& j, const std::string& file, const std::filesystem::path& data_dir = {});
// `name_or_path` is a built-in name (topologies/<name>.json under data_dir) or a path.
Cluster load_cluster(const std::string& name_or_path, const std::filesystem::path& data_dir);
// Names of the built-in clusters (file stems under data_dir/topologies), sorted.
std::vector<std::string> builtin_clusters(const std::filesystem::path& data_dir);

}  // namespace trainplan

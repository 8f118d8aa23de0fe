// The flags that describe one plan (model, cluster, GPU count, strategy), shared by predict,
// simulate and exec, and the --plan FILE alternative.
#pragma once
#include <filesystem>
#include <string>

#include "cli/flags.hpp"
#include "sim/cluster.hpp"
#include "sim/model_spec.hpp"
#include "sim/search.hpp"
#include "sim/software.hpp"
#include "sim/strategy.hpp"

namespace trainplan::cli {

struct PlanInputs {
  ModelSpec model;
  Cluster cluster;
  Software software;
  Strategy strategy;
};

// --software NAME|FILE (default: the plan file's "software", else kDefaultSoftware).
Software read_software_flag(const Flags& flags, const std::filesystem::path& data_dir,
                            const std::string& fallback = kDefaultSoftware);

// Reads --model --cluster --software --gpus --tp --pp --dp --cp --vp --zero --micro-batch --global-batch --seq
// --recompute --sequence-parallel --schedule --dtype --attention --fp32-grad-accum --rank-order,
// --dp-algorithm --ps-servers --ps-placement --grad-compression,
// or --plan FILE (a trainplan/prediction/v1 or trainplan/search/v1 object; explicit flags
// override it). Validates the strategy against the model; throws InputError naming the flag.
PlanInputs read_plan_flags(const Flags& flags, const std::filesystem::path& data_dir,
                           const std::string& default_cluster = "");

// Help text for those flags, one per line, for a command's --help.
std::string plan_flags_help();

// The data-parallel algorithm part of a search space (search and capacity): --dp-algorithms LIST
// (from allreduce,ps,ps-async; default allreduce), --grad-compressions LIST (from none, bf16,
// powersgd:R; default none), --ps-servers S, --ps-placement dedicated|colocated and
// --fp32-grad-accum on|off. Throws InputError naming the flag.
void read_dp_space_flags(const Flags& flags, SearchSpace& space);
std::string dp_space_flags_help();

}  // namespace trainplan::cli

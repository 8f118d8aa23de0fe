// The flags that describe one plan (model, cluster, GPU count, strategy), shared by predict,
// simulate and exec, and the --plan FILE alternative.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "cli/flags.hpp"
#include "sim/check.hpp"
#include "sim/cluster.hpp"
#include "sim/layer_graph.hpp"
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
  // Where the sequence length came from when it was neither --seq nor the plan file's nor a
  // trainplan model's seq_len (a Hugging Face config), e.g. "sequence length 8192: the Llama 3
  // family's pre-training length (...); --seq sets it"; empty otherwise. Commands print it.
  std::string seq_note;
  // Where pp x vp exceeds the layers and --pipeline-accounts was not given: which modules the split
  // counts as layers, and why (account_extra_chunks in plan_flags.cpp); empty otherwise.
  std::string split_note;
};

// The note above for `model` when --seq is not given (empty when the model's seq_len is its own).
std::string sequence_note(const ModelSpec& model);

// When the model has dropout and `software` runs none (runs_dropout false: e.g. pytorch-eager,
// trainplan-exec), a note that the figures leave dropout out and which profiles cost it; empty
// otherwise. predict, simulate, search and capacity print it with their other notes.
std::string dropout_note(const ModelSpec& model, const Software& software);

// When `software` names an attention kernel `cluster` has no table for, a note that the cluster's
// calibrated attention table costs it instead; empty otherwise.
std::string attention_kernel_note(const Cluster& cluster, const Software& software);

// "8.03B parameters", or for a model with experts or MTP modules "671.03B parameters, 37.55B
// active" (LayerGraph::counts; the MTP modules' own are outside the total, as published).
std::string parameters_text(const LayerGraph& graph);
// The counts a prediction document carries ("parameters"): for models with experts or MTP
// modules, whose active and total counts differ; nothing for others.
std::optional<ParamCounts> parameter_counts(const LayerGraph& graph);

// Prints each non-empty note as "trainplan COMMAND: note: ..." on `err`. Commands call it once
// every check has passed, so that a refusal stays exactly one line.
void print_notes(std::ostream& err, const char* command, std::initializer_list<std::string> notes);

// --software NAME|FILE (default: the plan file's "software", else kDefaultSoftware).
Software read_software_flag(const Flags& flags, const std::filesystem::path& data_dir,
                            const std::string& fallback = kDefaultSoftware);

// Reads --model --cluster --software --gpus --tp --pp --dp --cp --vp --zero --micro-batch --global-batch --seq
// --recompute --sequence-parallel --schedule --dtype --attention --fp32-grad-accum --rank-order,
// --dp-algorithm --ps-servers --ps-placement --grad-compression,
// or --plan FILE (a trainplan/prediction/v1 or trainplan/search/v1 object; explicit flags
// override it). Validates the strategy against the model; throws InputError naming the flag.
// Without --plan, the software is --software, else `default_software`; for a model with experts
// --moe-dispatcher defaults to that profile's dispatcher.
PlanInputs read_plan_flags(const Flags& flags, const std::filesystem::path& data_dir,
                           const std::string& default_cluster = "",
                           const std::string& default_software = kDefaultSoftware);

// Help text for those flags, one per line, for a command's --help.
std::string plan_flags_help();

// The data-parallel algorithm part of a search space (search and capacity): --dp-algorithms LIST
// (from allreduce,ps,ps-async; default allreduce), --grad-compressions LIST (from none, bf16,
// powersgd:R; default none), --ps-servers S, --ps-placement dedicated|colocated and
// --fp32-grad-accum on|off. Throws InputError naming the flag.
void read_dp_space_flags(const Flags& flags, SearchSpace& space);
std::string dp_space_flags_help();

// The expert part of a search space (search and capacity; sim/search.hpp ExpertSpace): --max-ep E,
// --etp LIST (from 1,tp), --moe-imbalance X, --moe-dispatcher, --moe-a2a-overlap on|off,
// --capacity-factor C, --recompute-modules LIST. Throws InputError naming the flag; the search
// checks the values against the model.
// --moe-dispatcher defaults to `software`'s dispatcher for a model with experts.
void read_expert_space_flags(const Flags& flags, const ModelSpec& model, const Software& software,
                             ExpertSpace& experts);
std::string expert_space_flags_help();
// --cuda-graphs none|full over `current` (a plan's, a search space's or a capacity request's).
CudaGraphs read_cuda_graphs(const Flags& flags, CudaGraphs current);
// --cuda-graph-modules LIST (GraphModule bits, "none" for none) over `current`.
unsigned read_cuda_graph_modules(const Flags& flags, unsigned current);

// A comma-separated list flag (--zero 0,1, --schedules 1f1b,...): each item through `parse`
// (std::nullopt: not one of `allowed`), `fallback` when the flag is absent. Throws InputError
// naming the flag for an unknown or empty item, and for one value named twice, as the same text
// (split_list) or two spellings of it (powersgd:4,powersgd:04; repeated_item).
template <class T, class Parse>
std::vector<T> list_flag(const Flags& f, const std::string& flag, const std::string& allowed, Parse parse,
                         std::vector<T> fallback) {
  auto v = f.get(flag);
  if (!v) return fallback;
  std::vector<T> out;
  for (const std::string& item : split_list(flag, *v)) {
    auto x = parse(item);
    if (!x) throw InputError(fmt::format("--{} {}: '{}' is not one of {}", flag, *v, item, allowed));
    if (std::find(out.begin(), out.end(), *x) != out.end()) throw repeated_item(flag, *v, item);
    out.push_back(*x);
  }
  return out;
}

}  // namespace trainplan::cli

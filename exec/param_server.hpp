// Synchronous parameter server over c10d (Li et al., "Scaling Distributed Machine Learning with the
// Parameter Server", OSDI 2014, with a barrier per step): `--dp-algorithm ps`. A worker runs it as
// its data-parallel scheme (parameter_server, grad_sync.hpp); a dedicated server runs it alone.
//
// The model's flat parameter buffer (n elements, one model chunk: PS runs without TP, CP and PP)
// is split into S contiguous shards, shard k = [floor(k·n/S), floor((k+1)·n/S)), held by server k
// on rank RankLayout::server_rank(k). Each step:
//   push    every worker sends its gradient's shard k to server k;
//   update  server k sums the W pushes in worker order (the mean gradient: workers scale their
//           loss by 1/global batch) and steps AdamW on its shard (ShardAdamW, as the DP reducer);
//   pull    server k sends the updated shard to every worker, which waits for all S shards before
//           its next forward.
// A colocated server is also a worker: its own contribution and its own pull are local copies.
// Every transfer is a send/recv on the `ps` group (Groups::ps), whose Comm counts the bytes.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "exec/model.hpp"
#include "exec/parallel.hpp"
#include "exec/optimizer.hpp"
#include "sim/rank_layout.hpp"

namespace trainplan::exec {

class ParamServer {
 public:
  // The roles of `rank` come from `layout`. `chunk`: this rank's model chunk; a worker's is its
  // model (pushed from and pulled into every step, kept by reference), a dedicated server's
  // supplies only the layout and initial values of its shard (copied; the chunk may go after).
  ParamServer(const RankLayout& layout, int rank, Comm& ps, PhaseClock& clock, AdamWSettings adam, ModelChunk& chunk);
  ~ParamServer();
  ParamServer(const ParamServer&) = delete;
  ParamServer& operator=(const ParamServer&) = delete;

  // One step's push, update and pull; waits for all of them. `with_grads` (debug dumps): the
  // servers also send the summed gradient shards, which reduced_grad() then returns on workers.
  void exchange(bool with_grads);
  // Worker, after exchange(true): the summed gradient as the servers applied it (flat, laid out
  // like the chunk's parameters).
  at::Tensor reduced_grad() const { return summed_grad_; }

 private:
  struct Shard;
  int64_t begin(int k) const;  // first element of shard k
  int64_t length(int k) const;

  const RankLayout& layout_;
  int rank_;
  Comm& ps_;
  PhaseClock& clock_;
  int64_t n_ = 0;               // elements of the flat buffer
  at::Tensor flat_, flat_grad_;  // a worker's model buffers (undefined on a dedicated server)
  at::Tensor summed_grad_;      // debug (with_grads), workers
  std::unique_ptr<Shard> shard_;  // the shard this rank serves, if it is a server
  int exchanges_ = 0;           // for message tags
};

}  // namespace trainplan::exec

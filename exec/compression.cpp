// Gradient compression in the DP reduction: bf16 and PowerSGD with error feedback (see
// compression.hpp for the algorithm and its source).
#include "exec/compression.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "exec/grad_sync.hpp"

namespace trainplan::exec {

// One compressed gradient matrix: where it lies in the flat gradient and its PowerSGD state.
struct GradCompressor::Matrix {
  int64_t offset = 0, rows = 0, cols = 0;
  at::Tensor q;      // n x r, warm-started from the previous step (the same on every rank)
  at::Tensor error;  // m x n, this rank's error feedback: what its contributions lost so far
};

struct GradCompressor::Chunk {
  at::Tensor flat_grad;
  std::vector<Matrix> matrices;                    // PowerSGD: compressed parameters
  std::vector<std::pair<int64_t, int64_t>> plain;  // PowerSGD: (offset, length) reduced uncompressed
};

GradCompressor::GradCompressor(const GradCompression& kind, long long seed) : kind_(kind), seed_(seed) {}
GradCompressor::~GradCompressor() = default;

int GradCompressor::add_chunk(const at::Tensor& flat_grad, const std::vector<ParamInfo>& params) {
  auto c = std::make_unique<Chunk>();
  c->flat_grad = flat_grad;
  if (kind_.kind == CompressionKind::powersgd) {
    const int64_t r = kind_.rank;
    // Q0: standard normal from a generator seeded alike on every rank (P = M Q needs the same Q).
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed_) + 0x9e3779b9ULL * (chunks_.size() + 1));
    int64_t covered = 0;  // flat elements before this one already assigned
    std::vector<ParamInfo> sorted = params;
    std::sort(sorted.begin(), sorted.end(), [](const ParamInfo& a, const ParamInfo& b) { return a.offset < b.offset; });
    for (const ParamInfo& p : sorted) {
      const auto shape = p.param.sizes();
      const bool compress = shape.size() == 2 && (shape[0] + shape[1]) * r < shape[0] * shape[1];
      if (!compress) continue;
      if (p.offset > covered) c->plain.emplace_back(covered, p.offset - covered);
      Matrix m;
      m.offset = p.offset;
      m.rows = shape[0];
      m.cols = shape[1];
      m.q = at::randn({m.cols, r}, gen, at::TensorOptions().dtype(at::kFloat)).to(flat_grad.device());
      m.error = at::zeros({m.rows, m.cols}, flat_grad.options());
      c->matrices.push_back(std::move(m));
      covered = p.offset + p.numel;
    }
    if (flat_grad.numel() > covered) c->plain.emplace_back(covered, flat_grad.numel() - covered);
  }
  chunks_.push_back(std::move(c));
  return static_cast<int>(chunks_.size()) - 1;
}

namespace {

// Concatenates 1-D views into one buffer, and copies a buffer back into them.
at::Tensor pack(const std::vector<at::Tensor>& parts) {
  std::vector<at::Tensor> flat;
  for (const auto& p : parts) flat.push_back(p.reshape({-1}));
  return at::cat(flat);
}
void unpack(const at::Tensor& buf, std::vector<at::Tensor>& parts) {
  int64_t off = 0;
  for (auto& p : parts) {
    p.copy_(buf.narrow(0, off, p.numel()).view(p.sizes()));
    off += p.numel();
  }
}

}  // namespace

void GradCompressor::reduce(int chunk, Comm& dp) {
  torch::NoGradGuard ng;
  Chunk& c = *chunks_.at(static_cast<size_t>(chunk));
  at::Tensor& g = c.flat_grad;
  if (kind_.kind == CompressionKind::bf16) {
    at::Tensor low = g.to(at::kBFloat16);
    dp.all_reduce(low);
    g.copy_(low);
    return;
  }
  if (kind_.kind != CompressionKind::powersgd) {
    dp.all_reduce(g);
    return;
  }
  const double W = dp.size();
  // Uncompressed part: biases, norms, matrices too small to gain, and the flat buffer's padding.
  if (!c.plain.empty()) {
    std::vector<at::Tensor> parts;
    for (auto [off, len] : c.plain) parts.push_back(g.narrow(0, off, len));
    at::Tensor buf = pack(parts);
    dp.all_reduce(buf);
    unpack(buf, parts);
  }
  if (c.matrices.empty()) return;
  // M = this rank's gradient + its error feedback; P = M Q (all matrices' P in one all-reduce).
  std::vector<at::Tensor> ms, ps, qs;
  for (Matrix& m : c.matrices) {
    at::Tensor grad = g.narrow(0, m.offset, m.rows * m.cols).view({m.rows, m.cols});
    ms.push_back(grad + m.error);
    ps.push_back(at::matmul(ms.back(), m.q));
  }
  at::Tensor pbuf = pack(ps);
  dp.all_reduce(pbuf);
  unpack(pbuf, ps);
  // Orthonormal columns of the summed P (reduced QR; every rank computes the same from the same
  // sum), then Q = Mᵀ P, summed over ranks: (Σ M_i)ᵀ P.
  for (size_t i = 0; i < ms.size(); ++i) {
    ps[i] = std::get<0>(at::linalg_qr(ps[i], "reduced"));
    qs.push_back(at::matmul(ms[i].t(), ps[i]));
  }
  at::Tensor qbuf = pack(qs);
  dp.all_reduce(qbuf);
  unpack(qbuf, qs);
  for (size_t i = 0; i < ms.size(); ++i) {
    Matrix& m = c.matrices[i];
    at::Tensor approx = at::matmul(ps[i], qs[i].t());  // ≈ Σ_i M_i, the same on every rank
    m.error.copy_(ms[i] - approx / W);                 // Σ_i error_i = Σ_i M_i - approx
    g.narrow(0, m.offset, m.rows * m.cols).view({m.rows, m.cols}).copy_(approx);
    m.q.copy_(qs[i]);                                  // warm start for the next step
  }
}

namespace {

// ZeRO 0 with --grad-compression over several replicas: every replica holds and steps the whole
// chunk, as replicated_all_reduce, but the chunk's gradient is summed through a GradCompressor,
// synchronously once its gradients are complete (each compressed sum needs the one before it, so
// nothing overlaps the backward).
class CompressedAllReduce final : public GradSync {
 public:
  CompressedAllReduce(Comm& dp, Comm& tp, PhaseClock& clock, bool sequence_parallel, const GradCompression& kind,
                      long long seed)
      : dp_(dp), tp_(tp), clock_(clock), sp_(sequence_parallel), compressor_(kind, seed) {}

  Shard add_chunk(ModelChunk& model, bool) override {
    // PowerSGD compresses per matrix of the unfused model (wq, wk, wv apart, as predict counts them).
    compressor_.add_chunk(model.flat_grad(), model.tensors());
    models_.push_back(&model);
    Shard s;
    s.master = model.flat();
    s.grad = model.flat_grad();
    return s;
  }
  void begin_step() override {
    for (ModelChunk* m : models_) m->flat_grad().zero_();
  }
  void reduce(int chunk) override {
    if (sp_) sum_over_tp(models_[chunk]->tp_partial_grads(), tp_);
    PhaseScope sc(clock_, Ph::dp_comm);
    const auto t0 = SyncClock::now();
    compressor_.reduce(chunk, dp_);
    clock_.dp_in_flight += seconds_since(t0);
  }
  void finish(bool) override {}

 private:
  Comm& dp_;
  Comm& tp_;
  PhaseClock& clock_;
  bool sp_;
  GradCompressor compressor_;
  std::vector<ModelChunk*> models_;
};

}  // namespace

std::unique_ptr<GradSync> compressed_all_reduce(Comm& dp, Comm& tp, PhaseClock& clock, bool sequence_parallel,
                                                const GradCompression& kind, long long seed) {
  return std::make_unique<CompressedAllReduce>(dp, tp, clock, sequence_parallel, kind, seed);
}

}  // namespace trainplan::exec

#include "ptrain/engine/distributed_optimizer.h"

#include <torch/torch.h>

#include <algorithm>

#include "ptrain/comm/communicator.h"
#include "ptrain/engine/placement.h"

namespace ptrain {
namespace {

int64_t bytesOf(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

// The dtype a bucket's parameters are gathered in: theirs when they share
// one (bf16 parameters travel as bf16, rounded as the non-sharded optimizer
// rounds its masters), float32 otherwise.
at::ScalarType gatherDtype(const std::vector<at::Tensor>& params) {
  at::ScalarType dtype = params.front().scalar_type();
  for (const auto& p : params)
    if (p.scalar_type() != dtype) return at::kFloat;
  return dtype;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(const std::vector<std::pair<std::string, at::Tensor>>& named,
                                           const OptimizerOptions& options, const Placement& placement,
                                           const LayoutGroups& groups, int64_t bucketBytes) {
  torch::NoGradGuard noGrad;
  const ParallelLayout& layout = groups.layout();
  const int64_t bucketElements = std::max<int64_t>(1, bucketBytes / static_cast<int64_t>(sizeof(float)));
  // Trained parameters per reduce group, in the order given.
  std::map<GroupKind, std::vector<std::pair<std::string, at::Tensor>>> byGroup;
  for (const auto& [name, p] : named) {
    if (p.requires_grad()) byGroup[Placement::gradientReduceGroup(placement.of(name), layout)].emplace_back(name, p);
  }
  for (auto& [kind, params] : byGroup) {
    std::shared_ptr<ProcessGroup> group = groups.group(kind);
    int64_t used = bucketElements;  // forces a new bucket for the first parameter
    for (auto& [name, p] : params) {
      if (buckets_.empty() || buckets_.back().group != group || used + p.numel() > bucketElements) {
        buckets_.emplace_back();
        buckets_.back().group = group;
        used = 0;
      }
      buckets_.back().members.push_back(Member{name, p, used});
      used += p.numel();
    }
  }

  std::vector<std::pair<std::string, at::Tensor>> pieces;
  ParamGroup decay{"decay", options.weight_decay, 1.0, {}};
  ParamGroup plain{"no_decay", 0.0, 1.0, {}};
  const int worldRank = groups.world().rank();
  for (Bucket& b : buckets_) {
    const int64_t size = b.group->size();
    const Member& last = b.members.back();
    b.padded = (last.offset + last.param.numel() + size - 1) / size * size;
    b.shard = b.padded / size;
    const int64_t lo = b.group->rank() * b.shard, hi = lo + b.shard;
    const auto options32 = last.param.options().dtype(at::kFloat).requires_grad(false);
    b.master = torch::zeros({b.shard}, options32);
    b.grad = torch::zeros({b.shard}, options32);
    for (Member& m : b.members) {
      m.piece_begin = std::max(m.offset, lo);
      m.piece_end = std::min(m.offset + m.param.numel(), hi);
      if (m.piece_begin >= m.piece_end) {
        m.piece_begin = m.piece_end = 0;
        continue;
      }
      const int64_t length = m.piece_end - m.piece_begin;
      at::Tensor master = b.master.narrow(0, m.piece_begin - lo, length);
      master.copy_(m.param.detach().reshape({-1}).narrow(0, m.piece_begin - m.offset, length));
      // The piece is the optimizer's parameter: a leaf sharing the master's
      // storage, whose gradient is the reduced range.
      at::Tensor piece = master.detach().requires_grad_(true);
      piece.mutable_grad() = b.grad.narrow(0, m.piece_begin - lo, length);
      m.piece = static_cast<int>(pieces.size());
      // Grouped as makeOptimizer groups the whole parameter.
      (m.param.dim() >= 2 ? decay : plain).index.push_back(pieces.size());
      pieces.emplace_back(m.name, piece);
      counted_.push_back(placement.countedInNorm(m.name, layout, worldRank, /*dataPartitioned=*/true));
    }
  }
  OptimizerOptions local = options;
  local.master_weights = false;  // the pieces are float32 already
  local_ = makeOptimizer(std::move(pieces), {decay, plain}, local);
}

DistributedOptimizer::~DistributedOptimizer() = default;

void DistributedOptimizer::finishGradients() {
  torch::NoGradGuard noGrad;
  commBytes_ = 0;
  for (Bucket& b : buckets_) {
    at::Tensor flat = torch::zeros({b.padded}, b.grad.options());
    for (const Member& m : b.members) {
      const at::Tensor& g = m.param.grad();
      if (g.defined()) flat.narrow(0, m.offset, m.param.numel()).copy_(g.reshape({-1}));
    }
    if (b.group->size() == 1) {
      b.grad.copy_(flat);
      continue;
    }
    b.group->reduceScatter(b.grad, flat)->wait();
    commBytes_ += bytesOf(flat);
  }
}

void DistributedOptimizer::afterStep(const StepResult& result) {
  torch::NoGradGuard noGrad;
  for (Bucket& b : buckets_) {
    std::vector<at::Tensor> params;
    for (const Member& m : b.members) params.push_back(m.param);
    if (result.applied) {
      at::Tensor full;
      const at::ScalarType dtype = gatherDtype(params);
      if (b.group->size() == 1) {
        full = b.master.to(dtype);
      } else {
        at::Tensor mine = b.master.to(dtype);
        full = torch::empty({b.padded}, mine.options());
        b.group->allgather(full, mine)->wait();
        commBytes_ += bytesOf(full);
      }
      for (Member& m : b.members) {
        m.param.detach().copy_(full.narrow(0, m.offset, m.param.numel()).view(m.param.sizes()));
      }
    }
    for (Member& m : b.members)
      if (m.param.grad().defined()) m.param.mutable_grad().zero_();
  }
}

std::map<std::string, double> DistributedOptimizer::stepStats() const {
  return {{"dp_comm_bytes", static_cast<double>(commBytes_)}};
}

std::vector<DistributedOptimizer::Piece> DistributedOptimizer::pieces() {
  std::map<std::string, at::Tensor> pieceState;
  for (auto& [name, t] : local_->state()) pieceState[name] = t;
  std::vector<Piece> out;
  for (Bucket& b : buckets_) {
    const int64_t lo = b.group->rank() * b.shard;
    for (const Member& m : b.members) {
      if (m.piece < 0) continue;
      Piece piece;
      piece.name = m.name;
      piece.param_sizes = m.param.sizes().vec();
      piece.param_dtype = m.param.scalar_type();
      piece.begin = m.piece_begin - m.offset;
      piece.end = m.piece_end - m.offset;
      piece.master = b.master.narrow(0, m.piece_begin - lo, m.piece_end - m.piece_begin);
      for (const auto& slot : local_->slotNames()) {
        auto it = pieceState.find(slot + "." + m.name);
        if (it != pieceState.end()) piece.slots.emplace_back(slot, it->second);
      }
      piece.saved_here = counted_[static_cast<size_t>(m.piece)];
      out.push_back(std::move(piece));
    }
  }
  return out;
}

int64_t DistributedOptimizer::stateBytes() const {
  int64_t total = 0;
  for (const auto& [name, t] : local_->state()) total += bytesOf(t);
  for (const Bucket& b : buckets_) total += bytesOf(b.master);
  return total;
}

}  // namespace ptrain

#include "ptrain/engine/distributed_optimizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "ptrain/comm/communicator.h"
#include "ptrain/engine/gradient_buffer.h"
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
                                           const LayoutGroups& groups, int64_t bucketBytes, bool overlap,
                                           bool gradientViews, bool wholeSums) {
  torch::NoGradGuard noGrad;
  const ParallelLayout& layout = groups.layout();
  GradientBuffer::Options bufferOptions;
  bufferOptions.reduction = GradientBuffer::Reduction::kReduceScatter;
  bufferOptions.bucket_bytes = bucketBytes;
  bufferOptions.overlap = overlap;
  bufferOptions.gradient_views = gradientViews;
  bufferOptions.whole_sums = wholeSums;
  bufferOptions.skip_single_member_groups = false;  // a whole range is still the optimizer's
  if (!named.empty()) bufferOptions.device = named.front().second.device();
  buffer_ = std::make_unique<GradientBuffer>(named, placement, groups, bufferOptions);

  std::vector<std::pair<std::string, at::Tensor>> pieces;
  ParamGroup decay{"decay", options.weight_decay, 1.0, {}};
  ParamGroup plain{"no_decay", 0.0, 1.0, {}};
  const int worldRank = groups.world().rank();
  // Pieces in registration order (the buffer holds its buckets in launch
  // order, last first), so the optimizer's parameters keep the model's order.
  std::vector<GradientBuffer::Bucket*> ordered;
  for (auto& set : buffer_->sets())
    for (auto it = set.buckets.rbegin(); it != set.buckets.rend(); ++it) ordered.push_back(&*it);
  for (GradientBuffer::Bucket* bucket : ordered) {
    const GradientBuffer::Bucket& b = *bucket;
    const int64_t lo = b.group->rank() * b.shard, hi = lo + b.shard;
    Range range;
    range.bucket = bucket;
    range.grad = buffer_->reducedRange(b);
    std::vector<at::Tensor> params;
    for (const GradientBuffer::Member& m : b.members) params.push_back(m.param);
    range.gather_dtype = gatherDtype(params);
    // Contiguous parameters: the bucket's parameters become views of one
    // tensor in their dtype, laid out as the bucket, so the all-gather after
    // the step writes the updated values straight into them (Megatron's
    // parameter buffer). Only where they share a dtype and the device, and
    // nothing moves their storage (offload).
    if (gradientViews) {
      const at::ScalarType dtype = range.gather_dtype;
      bool fits = true;
      for (const at::Tensor& p : params)
        fits = fits && p.scalar_type() == dtype && p.device() == b.data.device() && p.is_contiguous();
      if (fits) {
        range.params = torch::zeros({b.padded}, params.front().options().dtype(dtype).requires_grad(false));
        for (const GradientBuffer::Member& m : b.members) {
          at::Tensor slice = range.params.narrow(0, m.offset, m.param.numel());
          slice.copy_(m.param.detach().reshape({-1}));
          m.param.set_data(slice.view(m.param.sizes()));
        }
      }
    }
    // Float32 parameters in one tensor are their own masters: the optimizer
    // updates the rank's range of it in place, and the all-gather sends it
    // from there (no copy, no second float32 copy of the range).
    const bool ownMasters = range.params.defined() && range.params.scalar_type() == at::kFloat;
    range.master = ownMasters ? range.params.narrow(0, lo, b.shard) : torch::zeros({b.shard}, b.data.options());
    range.own_master = ownMasters;
    for (const GradientBuffer::Member& m : b.members) {
      Member mine;
      mine.name = m.name;
      mine.param = m.param;
      mine.offset = m.offset;
      mine.piece_begin = std::max(m.offset, lo);
      mine.piece_end = std::min(m.offset + m.param.numel(), hi);
      if (mine.piece_begin >= mine.piece_end) {
        mine.piece_begin = mine.piece_end = 0;
        range.members.push_back(std::move(mine));
        continue;
      }
      const int64_t length = mine.piece_end - mine.piece_begin;
      at::Tensor master = range.master.narrow(0, mine.piece_begin - lo, length);
      if (!ownMasters) master.copy_(m.param.detach().reshape({-1}).narrow(0, mine.piece_begin - m.offset, length));
      // The piece is the optimizer's parameter: a leaf sharing the master's
      // storage, whose gradient is the reduced range (a view of the buffer).
      at::Tensor piece = master.detach().requires_grad_(true);
      piece.mutable_grad() = range.grad.narrow(0, mine.piece_begin - lo, length);
      mine.piece = static_cast<int>(pieces.size());
      // Grouped as makeOptimizer groups the whole parameter.
      (m.param.dim() >= 2 ? decay : plain).index.push_back(pieces.size());
      pieces.emplace_back(m.name, piece);
      counted_.push_back(placement.countedInNorm(m.name, layout, worldRank, /*dataPartitioned=*/true));
      range.members.push_back(std::move(mine));
    }
    ranges_.push_back(std::move(range));
  }
  OptimizerOptions local = options;
  local.master_weights = false;  // the pieces are float32 already
  local_ = makeOptimizer(std::move(pieces), {decay, plain}, local);
  // Which range each piece is of, and how many pieces each range has: the
  // step reports each piece as it is updated, and a range's all-gather
  // starts when its last piece is done, while the optimizer goes on with the
  // next ones.
  piecesOf_.assign(ranges_.size(), 0);
  for (size_t r = 0; r < ranges_.size(); ++r) {
    for (const Member& m : ranges_[r].members) {
      if (m.piece < 0) continue;
      if (rangeOfPiece_.size() <= static_cast<size_t>(m.piece)) rangeOfPiece_.resize(m.piece + 1);
      rangeOfPiece_[m.piece] = r;
      ++piecesOf_[r];
    }
  }
  local_->update_observer = [this](size_t index, bool done) {
    if (!done) return;
    --piecesLeft_[rangeOfPiece_[index]];
    startGathers(/*all=*/false);
  };
}

DistributedOptimizer::~DistributedOptimizer() {
  // No all-gather may outlive the tensors it writes into.
  try {
    awaitParameters();
  } catch (const std::exception&) {
    // A failed group already said why; a destructor must not throw.
  }
}

void DistributedOptimizer::gatherDuringNextForward(std::function<int(const std::string& name)> blockOf) {
  deferGathers_ = true;
  rangesOfBlock_.clear();
  outerRanges_.clear();
  for (size_t r = 0; r < ranges_.size(); ++r) {
    std::set<int> blocks;
    for (const Member& m : ranges_[r].members) blocks.insert(blockOf(m.name));
    for (int b : blocks) (b < 0 ? outerRanges_ : rangesOfBlock_[b]).push_back(r);
  }
}

namespace {

// Waits for an all-gather still in flight, then drops it: a c10d Work keeps its tensors.
void finishGather(std::shared_ptr<Work>& gathering) {
  if (!gathering) return;
  std::shared_ptr<Work> work = std::move(gathering);
  work->wait();
}

}  // namespace

void DistributedOptimizer::awaitRanges(const std::vector<size_t>& ranges) {
  for (size_t r : ranges) finishGather(ranges_[r].gathering);
}

void DistributedOptimizer::awaitParameters() {
  for (Range& r : ranges_) finishGather(r.gathering);
}

void DistributedOptimizer::beginStep(const StepInfo&) { awaitRanges(outerRanges_); }

at::Tensor DistributedOptimizer::runBlock(int index, const at::Tensor& input, const BlockRunner& next) {
  auto it = rangesOfBlock_.find(index);
  if (it != rangesOfBlock_.end()) awaitRanges(it->second);
  return next(input);
}

void DistributedOptimizer::beforeBackward(int index, int count) { buffer_->beforeBackward(index, count); }

void DistributedOptimizer::finishGradients() {
  // Every block has run by now; a range no forward pass waited for (a
  // block this step skipped) is waited for before the step writes it.
  awaitParameters();
  buffer_->finish();
  // Before the step: no range is gathered yet.
  piecesLeft_ = piecesOf_;
  nextGather_ = 0;
  gatherBytes_ = 0;
}

// Starts the all-gathers of the ranges whose pieces are all updated (every
// range with `all`), strictly in range order: every member issues them in
// the same order, whichever of its ranges hold no piece.
void DistributedOptimizer::startGathers(bool all) {
  torch::NoGradGuard noGrad;
  while (nextGather_ < ranges_.size() && (all || piecesLeft_[nextGather_] == 0)) {
    Range& r = ranges_[nextGather_++];
    const GradientBuffer::Bucket& b = *r.bucket;
    const at::ScalarType dtype = r.gather_dtype;
    at::Tensor gathered = r.params;
    if (!gathered.defined()) {
      // Parameters of their own: one scratch buffer of the largest bucket's
      // size serves every range in turn (each all-gather is waited for
      // before the next), kept from step to step: a new one each time would
      // cost the host a page fault per 4 KiB.
      const int64_t bytes = b.padded * static_cast<int64_t>(c10::elementSize(dtype));
      if (!gatherScratch_.defined() || gatherScratch_.numel() < bytes) {
        gatherScratch_ = torch::empty({bytes}, r.master.options().dtype(at::kByte));
      }
      gathered = gatherScratch_.narrow(0, 0, bytes).view(dtype);
    }
    // The rank's updated range, rounded to the parameters' dtype, then
    // everyone's.
    at::Tensor mine = gathered.narrow(0, b.group->rank() * b.shard, b.shard);
    if (!r.own_master) mine.copy_(r.master);
    std::shared_ptr<Work> work;
    if (b.group->size() > 1) {
      work = b.group->allgather(gathered, mine);
      gatherBytes_ += bytesOf(gathered);
    }
    if (r.params.defined()) {
      // The parameters are views of it: waited for in afterStep, or by the
      // next forward pass (gatherDuringNextForward).
      r.gathering = std::move(work);
      continue;
    }
    if (work) work->wait();
    for (const Member& m : r.members) {
      m.param.detach().copy_(gathered.narrow(0, m.offset, m.param.numel()).view(m.param.sizes()));
    }
  }
}

void DistributedOptimizer::afterStep(const StepResult& result) {
  torch::NoGradGuard noGrad;
  if (result.applied) startGathers(/*all=*/true);  // any the step did not start (none, normally)
  if (!deferGathers_) awaitParameters();
  buffer_->zeroGradients();
}

std::map<std::string, double> DistributedOptimizer::stepStats() const {
  return {{"dp_comm_bytes", static_cast<double>(buffer_->commBytes() + gatherBytes_)},
          {"dp_overlapped_bytes", static_cast<double>(buffer_->overlappedBytes())},
          {"dp_wait_s", buffer_->waitSeconds()}};
}

std::vector<DistributedOptimizer::Piece> DistributedOptimizer::pieces() {
  std::map<std::string, at::Tensor> pieceState;
  for (auto& [name, t] : local_->state()) pieceState[name] = t;
  std::vector<Piece> out;
  for (Range& r : ranges_) {
    const int64_t lo = r.bucket->group->rank() * r.bucket->shard;
    for (const Member& m : r.members) {
      if (m.piece < 0) continue;
      Piece piece;
      piece.name = m.name;
      piece.param_sizes = m.param.sizes().vec();
      piece.param_dtype = m.param.scalar_type();
      piece.begin = m.piece_begin - m.offset;
      piece.end = m.piece_end - m.offset;
      piece.master = r.master.narrow(0, m.piece_begin - lo, m.piece_end - m.piece_begin);
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
  for (const Range& r : ranges_)
    if (!r.own_master) total += bytesOf(r.master);  // else the parameters' own range
  return total;
}

}  // namespace ptrain

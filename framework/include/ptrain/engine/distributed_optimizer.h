// DistributedOptimizer: optimizer states and float32 master weights sharded
// over each parameter's data-parallel group (optimizer.distributed; ZeRO
// stage 1, Megatron-LM's distributed optimizer).
//
// Layout. The gradients live in a GradientBuffer in reduce-scatter mode
// (engine/gradient_buffer.h): the trained parameters laid end to end, per
// gradient-reduce group (Placement::gradientReduceGroup: dp for dense
// parameters, edp for experts), in registration order, in float32 buckets of
// about `bucket_bytes`; each bucket is padded to a multiple of the group's
// size and member r owns the r-th equal range of every bucket. A parameter's
// "piece" on a rank is the part of it that falls in the rank's range
// (possibly none).
//
// A step, as hooks of the runtime (engine/hooks.h):
//   backward          each bucket is reduce-scattered over its group as soon
//                     as backward has produced all its gradients (with
//                     parallel.overlap_grad_reduce), in place: a rank's range
//                     of the buffer receives the sums of its range. Buckets
//                     with a gradient another plugin completes (sequence
//                     parallelism, tied embeddings) wait for finishGradients.
//                     This replaces the data plugin's all-reduce, which the
//                     runtime does not load.
//   finishGradients   launches what is left, after every other plugin's
//                     finishGradients, and waits.
//   optimizer step    local() updates the pieces: the rank's ranges in
//                     float32 (the master weights: for float32 parameters
//                     their own range of the bucket's parameter tensor, for
//                     16-bit ones float32 copies),
//                     with moments of the pieces' size. The arithmetic is
//                     the non-sharded optimizer's, element by element.
//                     As soon as the last piece of a bucket's range is
//                     updated, the range is rounded to the parameters' dtype
//                     and all-gathered straight into them (a bucket's
//                     parameters are views of one contiguous tensor), while
//                     the optimizer goes on with the next ranges.
//   afterStep         the gradients are zeroed; the all-gathers go on.
//   next forward      (gatherDuringNextForward) beginStep waits for the
//                     ranges that hold parameters outside the blocks (the
//                     embedding, the head), each block's runBlock for the
//                     ranges of its parameters: the all-gathers overlap the
//                     next forward pass, as Megatron-LM's overlap_param_gather.
//                     Without it, or when the parameters are not views of
//                     the gathered tensor, afterStep waits for them.
// Whoever reads the parameters outside a step calls awaitParameters() first
// (ModelRuntime does, in model(), inference() and its checkpoint and weight
// paths).
// Per rank the optimizer state and masters take 1/dp of the non-sharded
// optimizer's; the communication per step is a reduce-scatter plus an
// all-gather, the bytes of one all-reduce.
//
// Norm and checks: local()'s parameters are the pieces, named after their
// parameters, with the reduced gradient ranges as their gradients; each rank
// counts its own pieces (countedInNorm with the reduce group partitioned).
// Checkpoints: each rank saves its own ranges (pieces()) as flat blocks of
// the parameters' tensors, under the names the non-sharded optimizer's
// state() uses ("<slot>.<param>", and "master.<param>" only for parameters
// that are not float32), and loads whatever ranges it holds from a checkpoint
// of any layout, so a checkpoint moves between any dp and either optimizer
// without a rank ever holding more than its ranges (sharded_checkpoint.h).
//
// Thread-safety: one thread per rank; every member of a group calls the
// collective methods (finishGradients, afterStep) in the same order.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ptrain/engine/gradient_buffer.h"
#include "ptrain/engine/hooks.h"
#include "ptrain/engine/optimizer.h"

namespace ptrain {

class LayoutGroups;
class Placement;
class ProcessGroup;
class Work;

class PTRAIN_API DistributedOptimizer final : public StepHooks {
 public:
  // `named`: this rank's parameters (StagedModel::localParameters(); those
  // without requires_grad are left out), placed by `placement`. `options` as
  // for makeOptimizer; its master_weights is implied (every piece is float32).
  // `overlap`: reduce-scatter buckets during backward
  // (parallel.overlap_grad_reduce); `gradientViews`: the parameters'
  // gradients become views of the buffer (off when an offload plugin keeps
  // them elsewhere); `wholeSums`: every member receives the whole buckets'
  // sums (GradientBuffer::Options::whole_sums), for device groups.
  DistributedOptimizer(const std::vector<std::pair<std::string, at::Tensor>>& named, const OptimizerOptions& options,
                       const Placement& placement, const LayoutGroups& groups, int64_t bucketBytes = 16 << 20,
                       bool overlap = true, bool gradientViews = true, bool wholeSums = false);
  ~DistributedOptimizer() override;

  // The optimizer over this rank's pieces (weight decay grouped as
  // makeOptimizer groups the parameters they belong to).
  Optimizer& local() { return *local_; }
  // Per local().parameters(): whether this rank adds the piece to the global
  // gradient norm (it holds it and is index 0 of the axes it is replicated
  // along, data-parallel axes excepted).
  const std::vector<bool>& countedInNorm() const { return counted_; }

  // Lets the all-gathers of a step run on into the next forward pass:
  // `blockOf(name)` is the block a parameter belongs to, or -1 for the parts
  // around the blocks. Before the first step.
  void gatherDuringNextForward(std::function<int(const std::string& name)> blockOf);
  // Waits for every all-gather still in flight: the parameters hold the
  // step's values when it returns.
  void awaitParameters();

  void beginStep(const StepInfo& info) override;
  at::Tensor runBlock(int index, const at::Tensor& input, const BlockRunner& next) override;
  void beforeBackward(int index, int count) override;
  void finishGradients() override;
  void afterStep(const StepResult& result) override;
  std::map<std::string, double> stepStats() const override;

  // One parameter's range on this rank: elements [begin, end) of the
  // parameter's tensor on this rank (row-major), the optimizer's own tensors
  // of that range (read a checkpoint into them to load it), and whether this
  // rank is the one that saves it (countedInNorm: not a copy a tensor-parallel
  // peer holds too).
  struct Piece {
    std::string name;                  // the parameter's
    std::vector<int64_t> param_sizes;  // its tensor on this rank
    at::ScalarType param_dtype = at::kFloat;
    int64_t begin = 0, end = 0;
    at::Tensor master;                 // [end - begin] float32, the master values
    std::vector<std::pair<std::string, at::Tensor>> slots;  // ("exp_avg", [end - begin]), ...
    bool saved_here = false;
  };
  std::vector<Piece> pieces();
  // The count of applied steps, after a checkpoint was read into pieces().
  void setStepCount(int64_t steps) { local_->setStepCount(steps); }
  // Bytes this rank holds for the optimizer: state slots and master pieces.
  int64_t stateBytes() const;

 private:
  struct Member {         // one parameter of a bucket
    std::string name;
    at::Tensor param;
    int64_t offset = 0;   // in the bucket
    int64_t piece_begin = 0, piece_end = 0;  // the rank's part, in bucket offsets (empty when equal)
    int piece = -1;       // index into local().parameters(), or -1
  };
  struct Range {          // this rank's range of one bucket
    GradientBuffer::Bucket* bucket = nullptr;
    std::vector<Member> members;
    at::Tensor master;    // [shard] float32: the rank's range of the parameters
    at::Tensor grad;      // [shard] float32: the rank's range of the summed gradients (a view of the buffer)
    at::Tensor params;    // [padded] in the parameters' dtype, which they are views of; undefined: their own
    bool own_master = false;  // float32 `params`: `master` is its rank's range, updated in place
    at::ScalarType gather_dtype = at::kFloat;  // what the range travels as: the parameters' dtype when shared
    std::shared_ptr<Work> gathering;  // the all-gather into `params` still in flight, if any
  };
  void awaitRanges(const std::vector<size_t>& ranges);

  std::unique_ptr<GradientBuffer> buffer_;
  std::vector<Range> ranges_;
  std::unique_ptr<Optimizer> local_;
  std::vector<bool> counted_;
  int64_t gatherBytes_ = 0;
  at::Tensor gatherScratch_;  // bytes: the all-gather's output, one bucket at a time
  // The all-gathers start during the step, range by range (startGathers).
  void startGathers(bool all);
  std::vector<size_t> rangeOfPiece_;  // per local() parameter
  std::vector<int> piecesOf_;         // per range
  std::vector<int> piecesLeft_;       // per range, this step
  size_t nextGather_ = 0;
  // gatherDuringNextForward: the ranges each block's forward waits for, and
  // those beginStep waits for (parameters outside the blocks).
  bool deferGathers_ = false;
  std::map<int, std::vector<size_t>> rangesOfBlock_;
  std::vector<size_t> outerRanges_;
};

}  // namespace ptrain

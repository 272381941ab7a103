// DistributedOptimizer: optimizer states and float32 master weights sharded
// over each parameter's data-parallel group (optimizer.distributed; ZeRO
// stage 1, Megatron-LM's distributed optimizer).
//
// Layout. The trained parameters are laid end to end, per gradient-reduce
// group (Placement::gradientReduceGroup: dp for dense parameters, edp for
// experts), in buckets of about `bucket_bytes` of float32; each bucket is
// padded to a multiple of the group's size and member r owns the r-th equal
// range of every bucket. A parameter's "piece" on a rank is the part of it
// that falls in the rank's range (possibly none).
//
// A step, as hooks of the runtime (engine/hooks.h):
//   finishGradients   each bucket's gradients are flattened (float32) and
//                     reduce-scattered over the group: a rank receives the
//                     sums of its own range only. This replaces the data
//                     plugin's all-reduce, which the runtime does not load.
//   optimizer step    local() updates the pieces: float32 copies of the
//                     rank's ranges (the master weights, for every dtype),
//                     with moments of the pieces' size. The arithmetic is
//                     the non-sharded optimizer's, element by element.
//   afterStep         when the step was applied, each bucket's updated range
//                     is all-gathered and written back into the parameters
//                     (rounded to their dtype); the parameters' gradients are
//                     zeroed.
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

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ptrain/engine/hooks.h"
#include "ptrain/engine/optimizer.h"

namespace ptrain {

class LayoutGroups;
class Placement;
class ProcessGroup;

class PTRAIN_API DistributedOptimizer final : public StepHooks {
 public:
  // `named`: this rank's parameters (StagedModel::localParameters(); those
  // without requires_grad are left out), placed by `placement`. `options` as
  // for makeOptimizer; its master_weights is implied (every piece is float32).
  DistributedOptimizer(const std::vector<std::pair<std::string, at::Tensor>>& named, const OptimizerOptions& options,
                       const Placement& placement, const LayoutGroups& groups, int64_t bucketBytes = 16 << 20);
  ~DistributedOptimizer() override;

  // The optimizer over this rank's pieces (weight decay grouped as
  // makeOptimizer groups the parameters they belong to).
  Optimizer& local() { return *local_; }
  // Per local().parameters(): whether this rank adds the piece to the global
  // gradient norm (it holds it and is index 0 of the axes it is replicated
  // along, data-parallel axes excepted).
  const std::vector<bool>& countedInNorm() const { return counted_; }

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
  struct Member {         // one parameter in a bucket
    std::string name;
    at::Tensor param;
    int64_t offset = 0;   // in the bucket
    int64_t piece_begin = 0, piece_end = 0;  // the rank's part, in bucket offsets (empty when equal)
    int piece = -1;       // index into local().parameters(), or -1
  };
  struct Bucket {
    std::shared_ptr<ProcessGroup> group;
    std::vector<Member> members;
    int64_t padded = 0;   // elements, a multiple of the group's size
    int64_t shard = 0;    // padded / group size
    at::Tensor master;    // [shard] float32: the rank's range of the parameters
    at::Tensor grad;      // [shard] float32: the rank's range of the summed gradients
  };

  std::vector<Bucket> buckets_;
  std::unique_ptr<Optimizer> local_;
  std::vector<bool> counted_;
  int64_t commBytes_ = 0;
};

}  // namespace ptrain

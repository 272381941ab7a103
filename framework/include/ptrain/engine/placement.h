// Placement: where each parameter of a model lives across the ranks of a
// layout, and what that means for its gradient, norm and checkpoint.
//
// For every parameter: the layout grid it belongs to (dense layers or MoE
// experts, see ParallelLayout), the axes it is split along (a tensor-parallel
// column split, an expert split, a table's rows ...), whether its gradient is
// a partial sum that a plugin completes, which pipeline stage owns it, whether
// this rank holds it at all, and whether this rank's copy mirrors another
// stage's (a tied embedding on the last stage).
//
// Parallel plugins write it while they distribute a model (apply()); the
// engine reads it, and nothing else, to decide:
//   - which group sums a parameter's gradient over its data-parallel replicas
//     (gradientReduceGroup: dp for dense parameters, edp for experts);
//   - whether this rank adds the parameter to a global gradient norm
//     (countedInNorm: exactly one rank of the job counts each value);
//   - how a checkpoint gathers the full tensor (every shard axis) and slices
//     it again on load into any other layout (sliceOfFull).
// A parameter nobody placed is dense, whole, held and owned by every stage
// that has it: a model without parallelism needs no placement at all.
//
// Thread-safety: a plain value; written while the runtime is built (one
// thread), read afterwards.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/layout/parallel_layout.h"

namespace ptrain {

// One axis a parameter is split along: this rank holds slice `index` of
// `num_shards` equal slices along tensor dimension `dim`, of a parameter
// whose full size along `dim` is `full_size`. `num_shards` is the size of the
// layout group of `axis`, and `index` this rank's place in it.
struct ShardSpec {
  GroupKind axis = GroupKind::kTensor;
  int dim = 0;
  int num_shards = 1;
  int index = 0;
  int64_t full_size = 0;
};

// The grid of ParallelLayout a parameter lives in.
enum class ParamGrid {
  kDense,   // tp x cp x dp x pp
  kExpert,  // etp x ep x edp x pp
};

struct PTRAIN_API ParameterPlacement {
  ParamGrid grid = ParamGrid::kDense;
  // At most one entry per axis, in the order they were applied.
  std::vector<ShardSpec> shards;
  // Each rank holding it computes only part of its gradient (LayerNorm
  // weights under sequence parallelism, replicated over the tensor group; a
  // tied embedding's copies on the first and last pipeline stage). The plugin
  // that made it so sums the parts in finishGradients(); the distributed
  // optimizer's reduce-scatter waits for that (engine/gradient_buffer.h).
  bool partial_gradient = false;
  // The pipeline stage that owns it; -1 when no pipeline placed it.
  int stage = -1;
  // This rank holds its values and gradient. A parameter of another stage is
  // not held: its storage is released, it takes no gradient, and optimizer,
  // norms and checkpoints skip it.
  bool held = true;
  // This rank holds a copy of a parameter another stage owns (a tied
  // embedding on the last stage). The copy takes the same gradient and update
  // as the owner's; the owner alone counts it in norms and saves it.
  bool mirror = false;
  // Only the rows a step reads get a gradient other than zero (an embedding
  // table [rows, dim]): data parallelism gathers those rows and their indices
  // from every replica instead of all-reducing the whole tensor (the same
  // sums). Set by the model that knows it.
  bool row_sparse_gradient = false;

  // The split along `axis`, or nullptr.
  const ShardSpec* shardAlong(GroupKind axis) const;
  // This rank's slice of the full tensor `full` (every shard axis applied);
  // `full` itself when the parameter is whole. Throws CheckpointError naming
  // `name` when `full` has the wrong size along a split dimension.
  at::Tensor sliceOfFull(const at::Tensor& full, const std::string& name) const;
  // The full shape of the parameter whose local shard has `localSizes`.
  std::vector<int64_t> fullSizes(at::IntArrayRef localSizes) const;
  // Where this rank's shard (of `localSizes`) starts in the full tensor: per
  // dimension, index x the shard's size along every split dimension, 0 along
  // the others.
  std::vector<int64_t> offsets(at::IntArrayRef localSizes) const;
};

class PTRAIN_API Placement {
 public:
  // The placement of `name` (the default one when nothing placed it).
  const ParameterPlacement& of(const std::string& name) const;
  // The placement of `name`, for a plugin to fill in; created on first use.
  ParameterPlacement& edit(const std::string& name);
  // Records a split of `name` along `spec.axis`. Throws InternalError when the
  // parameter is already split along that axis or along that dimension.
  void addShard(const std::string& name, const ShardSpec& spec);

  bool held(const std::string& name) const { return of(name).held; }
  bool mirror(const std::string& name) const { return of(name).mirror; }
  bool sharded(const std::string& name) const { return !of(name).shards.empty(); }
  // Names with an explicit placement, sorted.
  std::vector<std::string> names() const;

  // The group that sums the gradients of a parameter's data-parallel replicas:
  // kData (kDataContext when cp > 1) for dense parameters, kExpertData for
  // experts.
  static GroupKind gradientReduceGroup(const ParameterPlacement& p, const ParallelLayout& layout);
  // True when this rank adds `name` to a gradient norm that is summed over
  // the whole world: the rank holds it, does not mirror it, and is the first
  // (index 0) of every group across which the parameter is replicated (the
  // grid's axes it is not split along, pipeline excepted), read from
  // `layout` for global rank `rank`. With `dataPartitioned` the data-parallel
  // axes (dp, cp and edp) split the value instead of replicating it (the
  // distributed optimizer's ranges): every rank there counts its own part.
  bool countedInNorm(const std::string& name, const ParallelLayout& layout, int rank,
                     bool dataPartitioned = false) const;

 private:
  std::map<std::string, ParameterPlacement> entries_;
};

}  // namespace ptrain

// A StagedModel sharded for tensor parallelism: the module-level sharding of
// ptrain/nn/tensor_parallel.h over the layers of the model's
// TensorParallelPlan, with every split recorded in model.placement (a
// ShardSpec along GroupKind::kTensor) and the partial-gradient parameters
// marked partial_gradient there. This is what the parallel/tensor plugin
// calls; the nn part knows nothing of StagedModel or Placement.
//
// The functions are overloads of the module-level ones and share their
// namespace, so a call reads nn::applyTensorParallel(model, state) for a
// module and for a model alike.
//
// Thread-safety: call once per model, before an optimizer holds its
// parameters, on the thread that runs the model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/nn/tensor_parallel.h"

namespace ptrain {
class StagedModel;
}

namespace ptrain::nn {

// Shards `model` for `state` (rank `state.rank` of `state.size`) and records
// the splits in model.placement. Returns the names of the replicated
// parameters whose gradients are partial sums under sequence parallelism
// (the plan's sequence_parallel_params and the row-parallel biases): the
// caller all-reduces their gradients over the group after each step's
// backward passes. Empty without sequence_parallel. Those are marked
// partial_gradient in model.placement. A state of size 1 splits and records
// nothing.
// Throws ConfigError when the model does not support tensor parallelism or a
// split dimension is not divisible by the group size (naming the parameter
// and both numbers); InternalError when the plan names a parameter the
// model does not have.
PTRAIN_API std::vector<std::string> shardTensorParallel(StagedModel& model, const TensorParallelState& state);
// Gives every layer of the model's plan, and then the model
// (StagedModel::setTensorParallel), the state to run with.
PTRAIN_API void setTensorParallelState(StagedModel& model, std::shared_ptr<const TensorParallelState> state);
// shardTensorParallel (without gradient tracking), then
// setTensorParallelState; returns the former's names.
PTRAIN_API std::vector<std::string> applyTensorParallel(StagedModel& model,
                                                        std::shared_ptr<const TensorParallelState> state);

// Records in model.placement the splits a layer made itself while it was
// built (a module built sharded: nn::EmbeddingTablesImpl::builtShards()),
// under `prefix` (the layer's name in the model, e.g. "embeddings."), each a
// piece `index` of `count` along the tensor group.
PTRAIN_API void recordBuiltShards(StagedModel& model, const std::string& prefix,
                                  const std::vector<TensorParallelSplit>& splits, int count, int index);

}  // namespace ptrain::nn

// Sharding a model for tensor parallelism: what the parallel/tensor plugin
// does, here so that tests and other plugins can do the same.
//
// For each layer of the model's TensorParallelPlan and each parameter the layer
// splits, shardTensorParallel narrows the parameter to the rank's slice in
// place (nn::narrowParameter, so the parameter object, its name and anything
// holding it stay the same) and records the split (a ShardSpec along
// GroupKind::kTensor) in model.placement, which the engine uses for gradient
// norms and checkpoints. In a runtime the model was built under
// nn::DeferredInit, so the parameters have no storage yet and nothing is
// copied: the runtime then allocates and draws each slice alone. A model built
// whole on its own (a test) has its slices copied out, so a tensor-parallel
// run starts from exactly the slices of the single-rank initialisation either
// way. setTensorParallelState then hands every layer and the model the state;
// applyTensorParallel does both.
//
// Thread-safety: call once per model, before an optimizer holds its
// parameters, on the thread that runs the model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/nn/tp_comm.h"

namespace ptrain {
class StagedModel;
}

namespace ptrain::nn {

// Shards `model` for `state` (rank `state.rank` of `state.size`), see above.
// Returns the names of the replicated parameters whose gradients are partial
// sums under sequence parallelism (the plan's sequence_parallel_params and the
// row-parallel biases): the caller all-reduces their gradients over the group
// after each step's backward passes. Empty without sequence_parallel. Those
// are marked partial_gradient in model.placement. A state of size 1 splits
// and records nothing.
// Throws ConfigError when the model does not support tensor parallelism or a
// split dimension is not divisible by the group size (naming the parameter
// and both numbers); InternalError when the plan names a parameter the
// model does not have.
PTRAIN_API std::vector<std::string> shardTensorParallel(StagedModel& model, const TensorParallelState& state);
// Gives every layer of the model's plan, and then the model
// (StagedModel::setTensorParallel), the state to run with.
PTRAIN_API void setTensorParallelState(StagedModel& model, std::shared_ptr<const TensorParallelState> state);
// shardTensorParallel, then setTensorParallelState; returns the former's names.
PTRAIN_API std::vector<std::string> applyTensorParallel(StagedModel& model,
                                                        std::shared_ptr<const TensorParallelState> state);

}  // namespace ptrain::nn

// Sharding a model for tensor parallelism: what the parallel/tensor plugin
// does in apply(), here so that tests and other plugins can do the same.
//
// The model is built full-size on every rank from the same seed. For each
// layer of the model's TensorParallelPlan and each parameter the layer splits,
// this keeps the rank's slice in place (Tensor::set_data, so the parameter
// object, its name and anything holding it stay the same) and records the
// split (a ShardSpec along GroupKind::kTensor) in model.placement, which the
// engine uses for gradient norms and (un)sharded checkpoints. A tensor-parallel run therefore starts from exactly
// the slices of the single-rank initialisation.
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

// Shards `model` for `state` (rank `state->rank` of `state->size`), gives
// every layer of its plan the state, then calls model.setTensorParallel.
// Returns the names of the replicated parameters whose gradients are partial
// sums under sequence parallelism (the plan's sequence_parallel_params and
// the row-parallel biases): the caller all-reduces their gradients over the
// group after each step's backward passes. Empty without sequence_parallel.
// Those are marked partial_gradient in model.placement. A state of size 1
// splits nothing and records no split (layers and model still get the state).
// Throws ConfigError when the model does not support tensor parallelism or a
// split dimension is not divisible by the group size (naming the parameter
// and both numbers); InternalError when the plan names a parameter the
// model does not have.
PTRAIN_API std::vector<std::string> applyTensorParallel(StagedModel& model,
                                                        std::shared_ptr<const TensorParallelState> state);

}  // namespace ptrain::nn

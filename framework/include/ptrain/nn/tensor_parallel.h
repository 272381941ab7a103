// Sharding a module for tensor parallelism: what the parallel/tensor plugin
// does to the ptrain::nn parallel layers a model is built from, here so that
// tests and other plugins can do the same. A StagedModel is sharded through
// ptrain/engine/tensor_parallel.h, which takes the layers from the model's
// TensorParallelPlan and records the splits in the model's placement.
//
// For each listed layer and each parameter the layer splits,
// shardTensorParallel narrows the parameter to the rank's slice in place
// (nn::narrowParameter, so the parameter object, its name and anything
// holding it stay the same) and reports the split, for the caller to record
// (a StagedModel's placement, which the engine uses for gradient norms and
// checkpoints). In a runtime the model was built under nn::DeferredInit, so
// the parameters have no storage yet and nothing is copied: the runtime then
// allocates and draws each slice alone. A module built whole on its own (a
// test) has its slices copied out, so a tensor-parallel run starts from
// exactly the slices of the single-rank initialisation either way.
// setTensorParallelState then hands every layer the state;
// applyTensorParallel does both.
//
// Thread-safety: call once per module, before an optimizer holds its
// parameters, on the thread that runs the module.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/nn/tp_comm.h"

namespace torch::nn {
class Module;
}

namespace ptrain::nn {

class ParallelLayer;

// What a module tells the sharding about itself: the same lists as a model's
// TensorParallelPlan (ptrain/engine/model.h).
struct TensorParallelLayers {
  // The ptrain::nn parallel layers the module is built from, each with its
  // parameter-name prefix in the module (e.g. "blocks.0.attn.qkv."). Not owned.
  std::vector<std::pair<std::string, ParallelLayer*>> layers;
  // Replicated parameters outside those layers whose gradient is a partial
  // sum on each rank under sequence parallelism (LayerNorm weights and biases).
  std::vector<std::string> sequence_parallel_params;
};

// One parameter narrowed to this rank's slice: split along `dim` into
// state.size equal pieces of a `full_size` dimension, of which this rank
// holds piece state.rank.
struct TensorParallelSplit {
  std::string name;
  int dim = 0;
  int64_t full_size = 0;
};

// What shardTensorParallel did.
struct TensorParallelShards {
  // Every split parameter, in the order of the layers.
  std::vector<TensorParallelSplit> splits;
  // The replicated parameters whose gradients are partial sums under
  // sequence parallelism (sequence_parallel_params and the layers'
  // sequenceParallelPartialParameters, e.g. row-parallel biases): the caller
  // all-reduces their gradients over the group after each step's backward
  // passes. Empty without sequence_parallel.
  std::vector<std::string> partial;
};

// Shards the parameters of `module` for `state` (rank `state.rank` of
// `state.size`), see above. A state of size 1 splits nothing and returns
// nothing.
// Throws ConfigError when a split dimension is not divisible by the group
// size (naming the parameter and both numbers); InternalError when `layers`
// names a parameter the module does not have, splits one twice, or lists a
// split parameter among the partial ones.
PTRAIN_API TensorParallelShards shardTensorParallel(torch::nn::Module& module, const TensorParallelLayers& layers,
                                                    const TensorParallelState& state);
// Gives every layer the state to run with.
PTRAIN_API void setTensorParallelState(const TensorParallelLayers& layers,
                                       std::shared_ptr<const TensorParallelState> state);
// shardTensorParallel (without gradient tracking), then
// setTensorParallelState; returns the former's result.
PTRAIN_API TensorParallelShards applyTensorParallel(torch::nn::Module& module, const TensorParallelLayers& layers,
                                                    std::shared_ptr<const TensorParallelState> state);

}  // namespace ptrain::nn

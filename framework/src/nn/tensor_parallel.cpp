#include "ptrain/nn/tensor_parallel.h"

#include <torch/torch.h>

#include <set>

#include "ptrain/nn/deferred_init.h"
#include "ptrain/nn/parallel_layers.h"

namespace ptrain::nn {

TensorParallelShards shardTensorParallel(torch::nn::Module& module, const TensorParallelLayers& layers,
                                         const TensorParallelState& state) {
  auto named = module.named_parameters();
  auto param = [&](const std::string& name) -> at::Tensor& {
    at::Tensor* p = named.find(name);
    PTRAIN_CHECK(p != nullptr, "tensor parallel plan names parameter '", name, "', which the model does not have");
    return *p;
  };
  // A group of one keeps every parameter whole and reports nothing.
  if (!state.active()) return {};

  std::set<std::string> done;
  TensorParallelShards out;
  for (const auto& [prefix, layer] : layers.layers) {
    PTRAIN_CHECK(layer != nullptr, "tensor parallel plan: null layer at '", prefix, "'");
    for (const auto& [local, dim] : layer->splitParameters()) {
      const std::string name = prefix + local;
      PTRAIN_CHECK(done.insert(name).second, "tensor parallel plan splits '", name, "' twice");
      at::Tensor& p = param(name);
      PTRAIN_CHECK(dim >= 0 && dim < p.dim(), "tensor parallel: '", name, "' has no dimension ", dim);
      const int64_t full = p.size(dim);
      PTRAIN_CHECK_AS(ConfigError, full % state.size == 0, "parallel.tensor_model_parallel_size: ", state.size,
                      " does not divide ", name, " (", toString(layer->parallelStyle()), "-parallel, size ", full,
                      " along dim ", dim, "); use a size that divides ", full);
      const int64_t chunk = full / state.size;
      // The parameter object stays (the module's member, the registered
      // parameter and tied users all see the slice).
      narrowParameter(p, dim, state.rank * chunk, chunk);
      out.splits.push_back(TensorParallelSplit{name, dim, full});
    }
    if (state.sequence_parallel) {
      for (const auto& local : layer->sequenceParallelPartialParameters()) out.partial.push_back(prefix + local);
    }
  }
  if (state.sequence_parallel) {
    for (const auto& name : layers.sequence_parallel_params) out.partial.push_back(name);
  }
  for (const auto& name : out.partial) {
    param(name);  // exists
    PTRAIN_CHECK(done.count(name) == 0, "tensor parallel plan: '", name,
                 "' is split, so its gradient is not a partial sum");
  }
  return out;
}

void setTensorParallelState(const TensorParallelLayers& layers, std::shared_ptr<const TensorParallelState> state) {
  PTRAIN_CHECK(state != nullptr, "setTensorParallelState: null state");
  for (const auto& [prefix, layer] : layers.layers) {
    PTRAIN_CHECK(layer != nullptr, "tensor parallel plan: null layer at '", prefix, "'");
    layer->setTensorParallel(state);
  }
}

TensorParallelShards applyTensorParallel(torch::nn::Module& module, const TensorParallelLayers& layers,
                                         std::shared_ptr<const TensorParallelState> state) {
  PTRAIN_CHECK(state != nullptr, "applyTensorParallel: null state");
  torch::NoGradGuard noGrad;
  TensorParallelShards shards = shardTensorParallel(module, layers, *state);
  setTensorParallelState(layers, std::move(state));
  return shards;
}

}  // namespace ptrain::nn

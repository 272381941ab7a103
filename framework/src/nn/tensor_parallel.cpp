#include "ptrain/nn/tensor_parallel.h"

#include <torch/torch.h>

#include <set>

#include "ptrain/engine/model.h"
#include "ptrain/nn/deferred_init.h"
#include "ptrain/nn/parallel_layers.h"

namespace ptrain {

namespace nn {

std::vector<std::string> shardTensorParallel(StagedModel& model, const TensorParallelState& state) {
  TensorParallelPlan plan = model.tensorParallelPlan();
  auto named = model.module().named_parameters();
  auto param = [&](const std::string& name) -> at::Tensor& {
    at::Tensor* p = named.find(name);
    PTRAIN_CHECK(p != nullptr, "tensor parallel plan names parameter '", name, "', which the model does not have");
    return *p;
  };
  // A group of one keeps every parameter whole and records nothing.
  if (!state.active()) return {};

  std::set<std::string> done;
  std::vector<std::string> partial;
  for (const auto& [prefix, layer] : plan.layers) {
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
      model.placement.addShard(name, ShardSpec{GroupKind::kTensor, dim, state.size, state.rank, full});
    }
    if (state.sequence_parallel) {
      for (const auto& local : layer->sequenceParallelPartialParameters()) partial.push_back(prefix + local);
    }
  }
  if (state.sequence_parallel) {
    for (const auto& name : plan.sequence_parallel_params) partial.push_back(name);
  }
  for (const auto& name : partial) {
    param(name);  // exists
    PTRAIN_CHECK(model.placement.of(name).shardAlong(GroupKind::kTensor) == nullptr, "tensor parallel plan: '",
                 name, "' is split, so its gradient is not a partial sum");
    model.placement.edit(name).partial_gradient = true;
  }
  return partial;
}

void setTensorParallelState(StagedModel& model, std::shared_ptr<const TensorParallelState> state) {
  PTRAIN_CHECK(state != nullptr, "setTensorParallelState: null state");
  for (const auto& [prefix, layer] : model.tensorParallelPlan().layers) layer->setTensorParallel(state);
  model.setTensorParallel(state);
}

std::vector<std::string> applyTensorParallel(StagedModel& model, std::shared_ptr<const TensorParallelState> state) {
  PTRAIN_CHECK(state != nullptr, "applyTensorParallel: null state");
  torch::NoGradGuard noGrad;
  std::vector<std::string> partial = shardTensorParallel(model, *state);
  setTensorParallelState(model, std::move(state));
  return partial;
}

}  // namespace nn
}  // namespace ptrain

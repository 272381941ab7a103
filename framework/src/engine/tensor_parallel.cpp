#include "ptrain/engine/tensor_parallel.h"

#include <torch/torch.h>

#include "ptrain/engine/model.h"

namespace ptrain::nn {
namespace {

TensorParallelLayers layersOf(const TensorParallelPlan& plan) {
  return TensorParallelLayers{plan.layers, plan.sequence_parallel_params};
}

}  // namespace

std::vector<std::string> shardTensorParallel(StagedModel& model, const TensorParallelState& state) {
  // Asked first, whatever the size: a model without a plan refuses here.
  const TensorParallelLayers layers = layersOf(model.tensorParallelPlan());
  TensorParallelShards shards = shardTensorParallel(model.module(), layers, state);
  for (const auto& split : shards.splits) {
    model.placement.addShard(split.name,
                             ShardSpec{GroupKind::kTensor, split.dim, state.size, state.rank, split.full_size});
  }
  for (const auto& name : shards.partial) model.placement.edit(name).partial_gradient = true;
  return std::move(shards.partial);
}

void setTensorParallelState(StagedModel& model, std::shared_ptr<const TensorParallelState> state) {
  PTRAIN_CHECK(state != nullptr, "setTensorParallelState: null state");
  setTensorParallelState(layersOf(model.tensorParallelPlan()), state);
  model.setTensorParallel(std::move(state));
}

std::vector<std::string> applyTensorParallel(StagedModel& model, std::shared_ptr<const TensorParallelState> state) {
  PTRAIN_CHECK(state != nullptr, "applyTensorParallel: null state");
  torch::NoGradGuard noGrad;
  std::vector<std::string> partial = shardTensorParallel(model, *state);
  setTensorParallelState(model, std::move(state));
  return partial;
}

void recordBuiltShards(StagedModel& model, const std::string& prefix, const std::vector<TensorParallelSplit>& splits,
                       int count, int index) {
  for (const TensorParallelSplit& split : splits) {
    model.placement.addShard(prefix + split.name, ShardSpec{GroupKind::kTensor, split.dim, count, index, split.full_size});
  }
}

}  // namespace ptrain::nn

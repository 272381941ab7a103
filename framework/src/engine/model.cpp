#include "ptrain/engine/model.h"

#include <torch/torch.h>

#include "ptrain/engine/batch.h"
#include "ptrain/engine/engine.h"
#include "ptrain/engine/hooks.h"
#include "ptrain/engine/parallel.h"
#include "ptrain/engine/trainer.h"

namespace ptrain {

StagedModel::~StagedModel() = default;
PipelineInference::~PipelineInference() = default;
Trainer::~Trainer() = default;
ParallelPlugin::~ParallelPlugin() = default;
StepHooks::~StepHooks() = default;

TrainSummary Trainer::train(TrainingSession& session) { return defaultTrainingLoop(session, *this); }

bool ModelBuild::buildsBlock(int index) const {
  if (!blocks) return true;
  return std::binary_search(blocks->begin(), blocks->end(), index);
}

ModelBuild ModelBuild::outline() {
  ModelBuild b;
  b.blocks = std::vector<int>{};
  b.embed = false;
  b.head = false;
  return b;
}

at::Tensor MicroBatchRun::backwardLoss(const at::Tensor& lossSum) const {
  return lossSum * (loss_scale / loss_divisor);
}

int64_t StagedModel::blockCost(int index) {
  const std::string prefix = blockPrefix(index);
  int64_t cost = 0;
  for (const auto& item : module().named_parameters()) {
    if (item.key().compare(0, prefix.size(), prefix) == 0) cost += item.value().numel();
  }
  return cost;
}

// The tensor-parallel defaults: a model that does not override them cannot
// be split.
namespace {
[[noreturn]] void noTensorParallel() {
  throw ConfigError(
      "parallel.tensor_model_parallel_size: this model does not support tensor parallelism; set it to 1");
}
}  // namespace

TensorParallelPlan StagedModel::tensorParallelPlan() { noTensorParallel(); }

void StagedModel::setTensorParallel(std::shared_ptr<const nn::TensorParallelState>) { noTensorParallel(); }

at::Tensor StagedModel::forwardBlock(int index, const at::Tensor& hidden) {
  return block_wrapper ? block_wrapper(index, hidden) : runBlock(index, hidden);
}

LossOutput StagedModel::forward(const Batch& micro) {
  if (!pipeline) return head(forwardHidden(micro), micro);
  torch::NoGradGuard noGrad;
  at::Tensor hidden = forwardHidden(micro);
  // On the device the stages compute on (where the micro-batch is, which every
  // stage is given): the pipeline's backend (NCCL on cuda) broadcasts there.
  const at::Device device = !micro.tensors.empty() ? micro.tensors.begin()->second.device()
                            : hidden.defined()     ? hidden.device()
                                                   : at::Device(at::kCPU);
  at::Tensor sums = torch::zeros({2}, torch::TensorOptions(torch::kFloat64).device(device));
  if (pipeline->isLastStage()) {
    LossOutput out = head(hidden, micro);
    sums[0] = out.loss_sum.to(torch::kFloat64);
    sums[1] = out.count;
  }
  pipeline->broadcastFromLastStage(sums);
  return LossOutput{sums[0], sums[1].item<double>()};
}

at::Tensor StagedModel::forwardHidden(const Batch& micro) {
  if (pipeline) return pipeline->forwardBlocks(*this, pipeline->isFirstStage() ? embed(micro) : at::Tensor());
  at::Tensor hidden = embed(micro);
  for (int i = 0; i < numBlocks(); ++i) hidden = forwardBlock(i, hidden);
  return hidden;
}

void StagedModel::shareFromHead(at::Tensor& tensor) {
  if (pipeline) pipeline->broadcastFromLastStage(tensor);
}

std::vector<std::pair<std::string, at::Tensor>> StagedModel::localParameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& item : module().named_parameters()) {
    if (placement.held(item.key())) out.emplace_back(item.key(), item.value());
  }
  return out;
}

int64_t Batch::size() const { return tensors.empty() ? 0 : tensors.begin()->second.size(0); }

Batch Batch::slice(int64_t begin, int64_t end) const {
  Batch out;
  for (const auto& [name, t] : tensors) out.tensors.emplace(name, t.slice(0, begin, end));
  return out;
}

Batch Batch::to(at::Device device) const {
  Batch out;
  for (const auto& [name, t] : tensors) out.tensors.emplace(name, t.device() == device ? t : t.to(device));
  return out;
}

const at::Tensor& Batch::at(const std::string& name) const {
  auto it = tensors.find(name);
  PTRAIN_CHECK(it != tensors.end(), "batch has no tensor named '", name, "'");
  return it->second;
}

}  // namespace ptrain

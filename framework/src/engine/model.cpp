#include "ptrain/engine/model.h"

#include <torch/torch.h>

#include "ptrain/engine/batch.h"
#include "ptrain/engine/parallel.h"
#include "ptrain/engine/trainer.h"

namespace ptrain {

StagedModel::~StagedModel() = default;
PipelineInference::~PipelineInference() = default;
Trainer::~Trainer() = default;
ParallelPlugin::~ParallelPlugin() = default;

LossOutput StagedModel::forward(const Batch& micro) {
  if (!pipeline) return head(forwardHidden(micro), micro);
  torch::NoGradGuard noGrad;
  at::Tensor hidden = forwardHidden(micro);
  at::Tensor sums = torch::zeros({2}, torch::kFloat64);
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
  for (int i = 0; i < numBlocks(); ++i) hidden = runBlock(i, hidden);
  return hidden;
}

void StagedModel::shareFromHead(at::Tensor& tensor) {
  if (pipeline) pipeline->broadcastFromLastStage(tensor);
}

std::vector<std::pair<std::string, at::Tensor>> StagedModel::localParameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& item : module().named_parameters()) {
    if (remote_parameters.count(item.key()) == 0) out.emplace_back(item.key(), item.value());
  }
  return out;
}

int64_t Batch::size() const { return tensors.empty() ? 0 : tensors.begin()->second.size(0); }

Batch Batch::slice(int64_t begin, int64_t end) const {
  Batch out;
  for (const auto& [name, t] : tensors) out.tensors.emplace(name, t.slice(0, begin, end));
  return out;
}

const at::Tensor& Batch::at(const std::string& name) const {
  auto it = tensors.find(name);
  PTRAIN_CHECK(it != tensors.end(), "batch has no tensor named '", name, "'");
  return it->second;
}

}  // namespace ptrain

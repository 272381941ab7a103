#include "ptrain/engine/model.h"

#include <torch/torch.h>

#include "ptrain/engine/batch.h"
#include "ptrain/engine/parallel.h"
#include "ptrain/engine/trainer.h"

namespace ptrain {

StagedModel::~StagedModel() = default;
Trainer::~Trainer() = default;
ParallelPlugin::~ParallelPlugin() = default;

LossOutput StagedModel::forward(const Batch& micro) {
  at::Tensor hidden = embed(micro);
  for (int i = 0; i < numBlocks(); ++i) hidden = runBlock(i, hidden);
  return head(hidden, micro);
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

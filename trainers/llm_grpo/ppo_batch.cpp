#include "ppo_batch.h"

#include <torch/torch.h>

#include <algorithm>

#include "gpt_model.h"
#include "ptrain/comm/communicator.h"
#include "ptrain/comm/process_group.h"
#include "ptrain/core/error.h"
#include "ptrain/engine/runtime.h"

namespace ptrain::grpo {

Batch ppoBatch(const Rollout& rollout, const at::Tensor& advantages, int64_t padId) {
  const int64_t rows = static_cast<int64_t>(rollout.prompts.size());
  PTRAIN_CHECK(advantages.dim() == 1 && advantages.size(0) == rows && rollout.responses.size() == rollout.prompts.size(),
               "ppoBatch: ", rows, " prompts, ", rollout.responses.size(), " responses and advantages of shape ",
               advantages.sizes());
  int64_t longest = 1;
  for (int64_t r = 0; r < rows; ++r) {
    longest = std::max<int64_t>(
        longest, static_cast<int64_t>(rollout.prompts[static_cast<size_t>(r)].size() +
                                      rollout.responses[static_cast<size_t>(r)].size()));
  }
  const int64_t length = longest - 1;  // positions that predict a next token
  at::Tensor sequences = torch::full({rows, longest}, padId, torch::kInt64);
  at::Tensor mask = torch::zeros({rows, length});
  at::Tensor perToken = torch::zeros({rows, length});
  const at::Tensor adv = advantages.to(torch::kFloat32).cpu();
  for (int64_t r = 0; r < rows; ++r) {
    const auto& prompt = rollout.prompts[static_cast<size_t>(r)];
    const auto& response = rollout.responses[static_cast<size_t>(r)];
    std::vector<int64_t> seq = prompt;
    seq.insert(seq.end(), response.begin(), response.end());
    sequences[r].narrow(0, 0, static_cast<int64_t>(seq.size())).copy_(torch::tensor(seq, torch::kInt64));
    // Position i predicts token i + 1: the response's tokens are the targets
    // of positions prompt - 1 .. prompt + response - 2.
    const int64_t first = static_cast<int64_t>(prompt.size()) - 1;
    const int64_t count = static_cast<int64_t>(response.size());
    if (count > 0) {
      mask[r].narrow(0, first, count).fill_(1);
      perToken[r].narrow(0, first, count).fill_(adv[r].item<float>());
    }
  }
  Batch b;
  b.tensors["tokens"] = sequences.narrow(1, 0, length).contiguous();
  b.tensors["targets"] = sequences.narrow(1, 1, length).contiguous();
  b.tensors["response_mask"] = mask;
  b.tensors["advantages"] = perToken;
  return b;
}

at::Tensor targetLogProbs(const GptModels& models, ModelRuntime& runtime, const Batch& batch, int64_t microBatchSize) {
  PTRAIN_CHECK_AS(ConfigError, runtime.layout().sizes().pp == 1, "runtime '", runtime.name(),
                  "': log-probabilities under a pipeline are not supported yet; use pp 1");
  Batch inputs;
  inputs.tensors["tokens"] = batch.at("tokens");
  inputs.tensors["targets"] = batch.at("targets");
  std::vector<at::Tensor> parts;
  runtime.inference([&](StagedModel& model, const EvalContext&) {
    llm::GptModel& gpt = models.ownModel(model);
    for (const Batch& micro : runtime.microBatches(inputs, microBatchSize)) {
      at::Tensor hidden = gpt.embed(micro);
      for (int i = 0; i < gpt.numBlocks(); ++i) hidden = gpt.runBlock(i, hidden);
      parts.push_back(gpt.tokenLogProbs(hidden, micro.at("targets")));
    }
  });
  // Every data-parallel rank's rows (under device groups, every group's), on every rank.
  return runtime.assembleRows(torch::cat(parts, 0).contiguous(), inputs.size()).cpu();
}

}  // namespace ptrain::grpo

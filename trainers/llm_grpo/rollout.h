// The rollout: sampling responses to prompts with the GPT's KV cache
// (GptModel::decodeLogits), `n` samples per prompt, batched over prompts of
// any lengths. Sample `row` draws from its own generator (rowGenerator(seed,
// row)), so its tokens are the same on every rank of a tensor-parallel group
// (each gathers the whole vocabulary's logits), on any tensor-parallel size
// up to float rounding of the logits, and whichever data-parallel rank or
// batch generates it.
#pragma once

#include <cstdint>
#include <vector>

#include "gpt_model.h"
#include "ptrain/engine/model_trainer.h"
#include "sampling.h"

namespace ptrain {
class ModelRuntime;
}

namespace ptrain::grpo {

// The trainer whose buildModel() made a runtime's GPT: ownModel() gives it
// back as llm::GptModel.
using GptModels = ModelTrainer<llm::GptModel>;

struct RolloutOptions {
  SamplingOptions sampling;
  int64_t n = 1;                      // samples per prompt (rollout.n)
  int64_t max_response_length = 16;   // new tokens at most (data.max_response_length)
  int64_t stop_id = -1;               // a response ends after this token (-1: none)
  int64_t pad_id = 0;                 // fills prompts to the batch's longest
  uint64_t seed = 0;                  // with the row's index, seeds each sample's draws
};

struct Rollout {
  // Sample s of prompt p is row p * n + s.
  std::vector<std::vector<int64_t>> prompts;    // each row's prompt
  std::vector<std::vector<int64_t>> responses;  // each row's new tokens, ending with stop_id when emitted
};

// Samples the responses; `firstRow` is the index of this call's first sample
// in the whole rollout (a data-parallel rank's share starts later). Every
// rank of the model's tensor-parallel group must call it with the same
// prompts. Runs under NoGradGuard; call model.module().eval() first for
// dropout-free sampling. A response also ends where prompt + response reach
// seq_length + 1 tokens (as a training row: the model reads seq_length of
// them, and the last is only a target).
Rollout generate(llm::GptModel& model, const std::vector<std::vector<int64_t>>& prompts,
                 const RolloutOptions& options, int64_t firstRow = 0);

// The whole rollout on `runtime`'s layout (a GPT, pp 1): its data-parallel
// ranks share the samples (rank d of D generates rows [d k, (d + 1) k) with
// k = rows / D, each row seeded by its index as above), and every rank ends
// with all of them, so the result is the same on any layout. The model runs
// in eval mode. Collective over the world. Throws ConfigError when the
// samples (prompts x n) do not divide by the data-parallel size.
// `models`: the trainer that built the runtime's GPT (it hands the model
// back typed).
Rollout generateOnLayout(const GptModels& models, ModelRuntime& runtime,
                         const std::vector<std::vector<int64_t>>& prompts, const RolloutOptions& options);

}  // namespace ptrain::grpo

// From rollouts to what the actor's update takes (actor.h): the sequences
// padded into one batch with their next-token targets and response mask, the
// advantages on every response token, and the log-probabilities of the
// targets under a runtime's model (the actor before its update: "old"; the
// frozen reference: "ref").
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/engine/batch.h"
#include "rollout.h"

namespace ptrain {
class ModelRuntime;
}

namespace ptrain::grpo {

// Row r is prompt r followed by response r, padded with `padId` to the
// longest: "tokens" [rows, length] (the sequence without its last token),
// "targets" (the next token at each position), "response_mask" (1 where the
// target belongs to the response), and "advantages" (advantage r on every
// response position, 0 elsewhere). A row with an empty response has an empty
// mask. `advantages` [rows].
Batch ppoBatch(const Rollout& rollout, const at::Tensor& advantages, int64_t padId);

// The log-probability of every target of `batch` ("tokens", "targets") under
// `runtime`'s model, in eval mode and without gradient: float32 [rows,
// length], whole on every rank. Each data-parallel rank computes its share of
// the rows in micro-batches of `microBatchSize` (0: one), and the shares are
// gathered. Collective over the world; pp 1.
at::Tensor targetLogProbs(const GptModels& models, ModelRuntime& runtime, const Batch& batch, int64_t microBatchSize);

}  // namespace ptrain::grpo

// Sampling the next token for the rollout (actor_rollout_ref.rollout.*):
// temperature, top-k and top-p (nucleus) filtering of the logits, then one
// draw per row from that row's own generator, so a row's tokens depend on its
// seed alone: not on the rows it is batched with, the rank it runs on or the
// layout.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace ptrain::grpo {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = -1;        // -1 or 0: no limit
  double top_p = 1.0;        // 1: no limit
};

// The distribution a row of `logits` [rows, vocab] is sampled from: softmax of
// logits / temperature over the top_k largest, then the smallest set of the
// most likely tokens whose probability reaches top_p (the token that crosses
// it included), renormalised. Ties at the top-k boundary keep every tied
// token. Greedy (temperature 0) puts all the mass on the first largest logit.
// Returns float32 [rows, vocab].
at::Tensor samplingProbs(const at::Tensor& logits, const SamplingOptions& options);

// One token per row of `logits` [rows, vocab]: row r's token is the inverse
// of samplingProbs' cumulative distribution at one uniform draw from
// generators[r] (CPU generators: the same draws on every device). Each
// generator advances by one draw per call.
at::Tensor sampleTokens(const at::Tensor& logits, const SamplingOptions& options,
                        std::vector<at::Generator>& generators);

// The generator of sample `row` of a rollout seeded with `seed`.
at::Generator rowGenerator(uint64_t seed, int64_t row);

}  // namespace ptrain::grpo

// Cross-entropy and greedy choice over a vocabulary split across the
// tensor-parallel group (Megatron-LM's vocab-parallel cross entropy).
//
// Rank r of n holds the logits of vocabulary entries [r * k, (r + 1) * k) in
// the last dimension of `logits` (k = local vocabulary size). Entries with an
// id >= `validVocab` are padding (the vocabulary is padded so it splits
// evenly): their logits are treated as -inf, so they are never predicted and
// get no gradient.
//
// Forward: three all-reduces of one value per token (the max logit, the
// target's logit, the sum of exponentials); backward is local (softmax minus
// the one-hot target, on this rank's slice).
//
// Thread-safety: as tp_comm.h (one thread per rank, same call order).
#pragma once

#include <ATen/core/Tensor.h>

#include "ptrain/nn/tp_comm.h"

namespace ptrain::nn {

// Per-token cross-entropy, shape of `targets`, computed in float32 (the
// logits are cast) unless `inLogitsDtype` (Megatron's fp16_lm_cross_entropy:
// the softmax and the loss in the logits' half precision, where the host
// has kernels for it, host_fallback.h). The result is float32 either way.
// logits [..., k] of this rank's vocabulary slice; targets [...] int64 ids in
// [0, validVocab). `tp` null or of size 1: logits hold the whole (padded)
// vocabulary, and the result is torch's cross_entropy over its first
// validVocab entries.
PTRAIN_API at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                                int64_t validVocab, const TensorParallelState* tp,
                                                bool inLogitsDtype = false);

// The id of the largest logit over the whole vocabulary (first one on ties,
// as torch's argmax; padding never), shape of logits without the last
// dimension, int64. Two all-gathers of one value per row; no autograd.
PTRAIN_API at::Tensor vocabParallelArgmax(const at::Tensor& logits, int64_t validVocab,
                                          const TensorParallelState* tp);

}  // namespace ptrain::nn

// Fused kernels for a transformer's elementwise and normalisation work
// (recipe section `fusion`, docs/precision.md#fusion): each reads its inputs
// and writes its outputs once in forward and once in backward, where the
// libtorch composition makes a pass (and a temporary) per op.
//
// Each is a custom autograd function with host kernels: threaded over rows on
// libtorch's intra-op pool, inner loops the compiler vectorises, float32
// arithmetic for bf16 and fp16 storage. On other devices each computes the
// same function from libtorch ops. The results equal the unfused
// composition's to float rounding (tests/unit/test_fused.cpp).
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain::nn {

// softmax over the last dimension of scale * scores + mask. scores
// [..., T, S]; additiveMask [T, S] (0 where allowed, -inf where masked: a
// causal or padding mask), broadcast over the leading dimensions, or
// undefined. A row whose entries are all masked gives zeros (libtorch's
// softmax gives NaN) and passes no gradient.
PTRAIN_API at::Tensor fusedMaskedSoftmax(const at::Tensor& scores, double scale, const at::Tensor& additiveMask);
// Its backward, for kernels that hold the probabilities themselves (the host
// attention kernel): scale * probs * (gradProbs - rowsum(gradProbs * probs)).
PTRAIN_API at::Tensor fusedMaskedSoftmaxBackward(const at::Tensor& gradProbs, const at::Tensor& probs, double scale);

// gelu(x + bias), tanh form (GPT-2's); bias [H] over x's last dimension.
// Backward evaluates tanh once per element.
PTRAIN_API at::Tensor fusedBiasGelu(const at::Tensor& x, const at::Tensor& bias);

// residual + (x + bias) * noise. `noise`: the dropout's keep-mask already
// divided by (1 - p), shaped like x (dropoutNoise), or undefined (no
// dropout); `bias` [H] or undefined.
PTRAIN_API at::Tensor fusedBiasDropoutAdd(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual,
                                          const at::Tensor& noise);

// LayerNorm over the last dimension of sum = x + residual (residual may be
// undefined: sum = x). Returns {LayerNorm(sum) * weight + bias, sum}: the
// sum is the block's new residual stream.
PTRAIN_API std::pair<at::Tensor, at::Tensor> fusedAddLayerNorm(const at::Tensor& x, const at::Tensor& residual,
                                                               const at::Tensor& weight, const at::Tensor& bias,
                                                               double eps);

// Dropout's noise for a tensor shaped like `shard`: bernoulli(1 - p) / (1 - p)
// in shard's dtype, drawn from torch's generator exactly as torch::dropout
// draws it. With numShards > 1, the noise of the whole tensor (`shard`
// repeated numShards times along `dim`) is drawn and slice `index` kept, so
// every sequence-parallel rank keeps what one rank would.
PTRAIN_API at::Tensor dropoutNoise(const at::Tensor& shard, double p, int64_t dim = 0, int numShards = 1,
                                   int index = 0);

}  // namespace ptrain::nn

// The core of multi-head self-attention: softmax(scale * Q K^T + mask) V for
// every head, from the fused projection's output.
//
// Layout. `qkv` is [B, T, heads * 3 * d] with each head's query, key and value
// side by side ([B, T, heads, 3, d], the layout of GPT's fused qkv linear and
// of its tensor-parallel column shards); the result is [B, T, heads * d], the
// heads side by side, as the output projection reads them. `additiveMask` is
// [T, T] (e.g. 0 on and below the diagonal, -inf above: causal) and is added
// to every head's scores.
//
// Three implementations, the same numbers (to float rounding):
//  - batchedAttention: libtorch ops (reshape, baddbmm, softmax, bmm), for any
//    device and dtype; also the reference the tests check the other against.
//  - the host kernel (float32 tensors in host memory, when the host kernels
//    are on: host_kernels.h): each head's products are BLAS calls on the heads where
//    they lie, split over the intra-op threads, with the softmax and its
//    gradient as libtorch ops over all heads at once. It copies no q, k or v
//    out of the fused tensor, and uses every core for the per-head products,
//    which libtorch's CPU bmm (without MKL) runs one head at a time on one.
//  - on a CUDA device (libtorch 2.x): libtorch's fused attention kernel
//    (scaled_dot_product_attention, which picks the flash or memory-efficient
//    kernel for the dtype and card), never materialising the [T, T] scores.
#pragma once

#include <functional>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain::nn {

// Whichever implementation applies to these tensors. `fusedSoftmax`
// (fusion.masked_softmax): the mask, scale and softmax in one pass forward and
// backward (nn/fused.h) on the host paths; a row with every key masked then
// gives zeros instead of NaN.
// `probsNoise` ([B * heads, T, T], or undefined): attention dropout, the
// probabilities multiplied by it before they weight the values (the noise of
// nn::dropoutNoise); the host kernel applies it in its own pass.
PTRAIN_API at::Tensor multiHeadAttention(const at::Tensor& qkv, int64_t headDim, double scale,
                                         const at::Tensor& additiveMask, bool fusedSoftmax = false,
                                         const at::Tensor& probsNoise = {});

// The libtorch-ops implementation. `dropProbs`, when given, is applied to the
// attention probabilities ([B * heads, T, T]) before they weight the values
// (attention dropout, which the host kernel does not do).
PTRAIN_API at::Tensor batchedAttention(const at::Tensor& qkv, int64_t headDim, double scale,
                                       const at::Tensor& additiveMask,
                                       const std::function<at::Tensor(const at::Tensor&)>& dropProbs = {},
                                       bool fusedSoftmax = false);

// The fused device kernel; throws where libtorch has none (1.13).
PTRAIN_API at::Tensor fusedDeviceAttention(const at::Tensor& qkv, int64_t headDim, double scale,
                                           const at::Tensor& additiveMask);

// True when multiHeadAttention would take the host kernel for `qkv`.
PTRAIN_API bool hostAttentionApplies(const at::Tensor& qkv);

// True when multiHeadAttention would take the fused device kernel for `qkv`.
PTRAIN_API bool deviceAttentionApplies(const at::Tensor& qkv);

}  // namespace ptrain::nn

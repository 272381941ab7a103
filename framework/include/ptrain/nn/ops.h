// The elementwise and normalisation ops of ptrain's layers: libtorch's, or
// the same op in float32 where the host has no kernel for the tensor's dtype
// (host_fallback.h), so a layer written with these runs in any precision.
#pragma once

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain::nn {

// GELU, tanh approximation (GPT-2's).
PTRAIN_API at::Tensor gelu(const at::Tensor& x);
// LayerNorm over the last dimension with an affine weight and bias.
PTRAIN_API at::Tensor layerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);
// Inverted dropout (torch::dropout): identity unless training and p > 0.
PTRAIN_API at::Tensor dropout(const at::Tensor& x, double p, bool training);

}  // namespace ptrain::nn

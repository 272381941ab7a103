#include "ptrain/nn/ops.h"

#include <torch/torch.h>

#include "ptrain/nn/host_fallback.h"

namespace ptrain::nn {

at::Tensor gelu(const at::Tensor& x) {
  if (computeInFloat32(HostOp::kGelu, x)) return torch::gelu(x.to(at::kFloat), "tanh").to(x.scalar_type());
  return torch::gelu(x, "tanh");
}

at::Tensor layerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  const int64_t n = x.size(-1);
  if (computeInFloat32(HostOp::kLayerNorm, x)) {
    return at::layer_norm(x.to(at::kFloat), {n}, weight.to(at::kFloat), bias.to(at::kFloat), eps)
        .to(x.scalar_type());
  }
  return at::layer_norm(x, {n}, weight, bias, eps);
}

at::Tensor dropout(const at::Tensor& x, double p, bool training) {
  if (!training || p <= 0) return x;
  if (computeInFloat32(HostOp::kDropout, x)) return torch::dropout(x.to(at::kFloat), p, true).to(x.scalar_type());
  return torch::dropout(x, p, true);
}

}  // namespace ptrain::nn

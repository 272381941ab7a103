#include "ptrain/nn/host_kernels.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

#include "host_blas.h"
#include "ptrain/nn/host_fallback.h"

namespace ptrain::nn {
namespace {

std::atomic<bool> enabledFlag{false};

// Fewer rows than this per thread are not worth a thread.
constexpr int64_t kMinRowsPerThread = 16;

// body(first, count) over [0, n) in one contiguous block per intra-op thread.
template <typename Body>
void splitRows(int64_t n, const Body& body) {
  at::parallel_for(0, n, kMinRowsPerThread, [&](int64_t begin, int64_t end) { body(begin, end - begin); });
}

using detail::fitsBlasInt;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct HostLinearFn : torch::autograd::Function<HostLinearFn> {
  // x2: [M, K] contiguous; weight [N, K] contiguous; bias [N], or empty for
  // none (libtorch 1.13's Function::apply does not take undefined tensors).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x2, const at::Tensor& weight,
                            const at::Tensor& bias) {
    const int64_t M = x2.size(0), K = x2.size(1), N = weight.size(0);
    at::Tensor y = at::empty({M, N}, x2.options());
    const float* x = x2.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    const float* b = bias.numel() > 0 ? bias.data_ptr<float>() : nullptr;
    float* out = y.data_ptr<float>();
    splitRows(M, [&](int64_t r0, int64_t rows) {
      // The bias goes in first and the product is added to it (beta = 1),
      // as addmm does; the rows are still in cache for the product.
      if (b != nullptr) {
        for (int64_t r = r0; r < r0 + rows; ++r) std::memcpy(out + r * N, b, static_cast<size_t>(N) * sizeof(float));
      }
      detail::gemm(false, true, rows, N, K, 1.0f, x + r0 * K, K, w, K, b != nullptr ? 1.0f : 0.0f, out + r0 * N, N);
    });
    ctx->save_for_backward({x2, weight});
    ctx->saved_data["has_bias"] = b != nullptr;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x2 = saved[0];
    const at::Tensor& weight = saved[1];
    const int64_t M = x2.size(0), K = x2.size(1), N = weight.size(0);
    const at::Tensor dy = grads[0].contiguous();
    const float* g = dy.data_ptr<float>();
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      // dX = dY W, by rows of dY.
      dx = at::empty({M, K}, x2.options());
      const float* w = weight.data_ptr<float>();
      float* out = dx.data_ptr<float>();
      splitRows(M, [&](int64_t r0, int64_t rows) {
        detail::gemm(false, false, rows, K, N, 1.0f, g + r0 * N, N, w, K, 0.0f, out + r0 * K, K);
      });
    }
    if (ctx->needs_input_grad(1)) {
      // dW = dY^T X, by output features: each block sums over every row itself.
      dw = at::empty({N, K}, weight.options());
      const float* x = x2.data_ptr<float>();
      float* out = dw.data_ptr<float>();
      splitRows(N, [&](int64_t n0, int64_t count) {
        detail::gemm(true, false, count, K, M, 1.0f, g + n0, N, x, K, 0.0f, out + n0 * K, K);
      });
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) db = dy.sum(0);
    return {dx, dw, db};
  }
};

bool hostLinearApplies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!enabledFlag.load(std::memory_order_relaxed)) return false;
  auto isHostFloat = [](const at::Tensor& t) { return t.is_cpu() && t.scalar_type() == at::kFloat; };
  if (!isHostFloat(x) || !isHostFloat(weight) || weight.dim() != 2 || !weight.is_contiguous()) return false;
  if (bias.defined() && (!isHostFloat(bias) || bias.dim() != 1 || !bias.is_contiguous() ||
                         bias.size(0) != weight.size(0))) {
    return false;  // at::linear broadcasts, or says what is wrong
  }
  if (x.dim() < 1 || x.size(-1) != weight.size(1) || x.numel() == 0 || weight.numel() == 0) return false;
  return fitsBlasInt(x.numel() / x.size(-1)) && fitsBlasInt(weight.size(0)) && fitsBlasInt(weight.size(1));
}

}  // namespace

bool setHostKernels(bool enabled) {
  if (!enabled) {
    enabledFlag = false;
    detail::setBlasSingleThreaded(false);
    return false;
  }
  const bool ok = detail::blasAvailable() && detail::setBlasSingleThreaded(true);
  enabledFlag = ok;
  return ok;
}

bool hostKernelsEnabled() { return enabledFlag.load(std::memory_order_relaxed); }

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (computeInFloat32(HostOp::kLinear, x)) {
    return linear(x.to(at::kFloat), weight.to(at::kFloat), bias.defined() ? bias.to(at::kFloat) : bias)
        .to(x.scalar_type());
  }
  if (!hostLinearApplies(x, weight, bias)) return at::linear(x, weight, bias);
  std::vector<int64_t> outSizes = x.sizes().vec();
  outSizes.back() = weight.size(0);
  at::Tensor x2 = x.reshape({-1, x.size(-1)}).contiguous();
  const at::Tensor noBias = bias.defined() ? bias : at::empty({0}, weight.options());
  return HostLinearFn::apply(x2, weight, noBias).view(outSizes);
}

}  // namespace ptrain::nn

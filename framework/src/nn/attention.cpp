#include "ptrain/nn/attention.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>

#include "host_blas.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/nn/fused.h"
#include "ptrain/nn/host_fallback.h"
#include "ptrain/nn/host_kernels.h"

namespace ptrain::nn {
namespace {

using detail::fitsBlasInt;
using detail::gemm;

// Rows of one head's product per BLAS call. OpenBLAS runs a product with
// m * n * k below 4 * 65536 on the calling thread; above, it hands it to its
// own thread pool, which would then compete with the threads this kernel
// already spreads the heads over. Multiples of 8 keep the rows aligned to
// its kernels' blocking.
int64_t rowsPerCall(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kSingleThreadProduct = 4 * 65536;
  int64_t rows = std::max<int64_t>(1, (kSingleThreadProduct - 1) / std::max<int64_t>(1, n * k));
  if (rows >= 8) rows = rows / 8 * 8;
  return std::min(rows, m);
}

// Runs body(head, firstRow, rows) over every head's m rows in blocks of at
// most rowsPerCall, the blocks spread over the intra-op threads.
template <typename Body>
void forEachHeadBlock(int64_t heads, int64_t m, int64_t blockRows, const Body& body) {
  const int64_t blocks = (m + blockRows - 1) / blockRows;
  at::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t head = task / blocks;
      const int64_t first = (task % blocks) * blockRows;
      body(head, first, std::min(blockRows, m - first));
    }
  });
}

// Where one (sample, head) lies in the fused tensors.
struct HeadLayout {
  int64_t batch, length, heads, dim;
  int64_t qkvRow() const { return heads * 3 * dim; }  // between tokens in qkv
  int64_t outRow() const { return heads * dim; }      // between tokens in the output
  // Query of head `bh` (= sample * heads + head); key and value follow at +dim, +2 dim.
  int64_t qkvOffset(int64_t bh) const { return (bh / heads) * length * qkvRow() + (bh % heads) * 3 * dim; }
  int64_t outOffset(int64_t bh) const { return (bh / heads) * length * outRow() + (bh % heads) * dim; }
  int64_t scoreOffset(int64_t bh) const { return bh * length * length; }
};

HeadLayout layoutOf(const at::Tensor& qkv, int64_t headDim) {
  return {qkv.size(0), qkv.size(1), qkv.size(2) / (3 * headDim), headDim};
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct HostAttentionFn : torch::autograd::Function<HostAttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, int64_t headDim, double scale,
                            const at::Tensor& mask, bool fusedSoftmax, const at::Tensor& maybeNoise) {
    const HeadLayout L = layoutOf(qkv, headDim);
    const int64_t T = L.length, d = L.dim, BH = L.batch * L.heads;
    const float* x = qkv.data_ptr<float>();
    at::Tensor scores = at::empty({BH, T, T}, qkv.options());
    float* s = scores.data_ptr<float>();
    const float alpha = static_cast<float>(scale);
    // scores = scale * Q K^T, per head.
    forEachHeadBlock(BH, T, rowsPerCall(T, T, d), [&](int64_t bh, int64_t r0, int64_t r) {
      const float* q = x + L.qkvOffset(bh);
      gemm(false, true, r, T, d, alpha, q + r0 * L.qkvRow(), L.qkvRow(), q + d, L.qkvRow(), 0.0f,
           s + L.scoreOffset(bh) + r0 * T, T);
    });
    at::Tensor probs;
    if (fusedSoftmax) {
      // The scale is in the product already: mask and softmax in one pass.
      probs = fusedMaskedSoftmax(scores, 1.0, mask);
    } else {
      scores.add_(mask);
      probs = at::_softmax(scores, -1, false);
    }
    scores = at::Tensor();
    // Attention dropout: the values are weighted by the dropped probabilities.
    const at::Tensor noise = maybeNoise.numel() > 0 ? maybeNoise.contiguous() : at::Tensor();
    const at::Tensor weights = noise.defined() ? probs.mul(noise) : probs;
    const float* p = weights.data_ptr<float>();
    at::Tensor out = at::empty({L.batch, T, L.outRow()}, qkv.options());
    float* o = out.data_ptr<float>();
    // out = P V, per head, written where the output projection reads it.
    forEachHeadBlock(BH, T, rowsPerCall(T, d, T), [&](int64_t bh, int64_t r0, int64_t r) {
      const float* v = x + L.qkvOffset(bh) + 2 * d;
      gemm(false, false, r, d, T, 1.0f, p + L.scoreOffset(bh) + r0 * T, T, v, L.qkvRow(), 0.0f,
           o + L.outOffset(bh) + r0 * L.outRow(), L.outRow());
    });
    ctx->save_for_backward({qkv, probs, noise.defined() ? noise : at::empty({0}, qkv.options())});
    ctx->saved_data["head_dim"] = headDim;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["fused_softmax"] = fusedSoftmax;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& qkv = saved[0];
    const at::Tensor& probs = saved[1];
    const at::Tensor noise = saved[2].numel() > 0 ? saved[2] : at::Tensor();
    // What weighted the values: the probabilities, dropped where dropout was.
    const at::Tensor weights = noise.defined() ? probs.mul(noise) : probs;
    const int64_t headDim = ctx->saved_data["head_dim"].toInt();
    const auto alpha = static_cast<float>(ctx->saved_data["scale"].toDouble());
    const HeadLayout L = layoutOf(qkv, headDim);
    const int64_t T = L.length, d = L.dim, BH = L.batch * L.heads;
    const at::Tensor gradOut = grads[0].contiguous();
    const float* x = qkv.data_ptr<float>();
    const float* p = weights.data_ptr<float>();
    const float* g = gradOut.data_ptr<float>();
    // Every query, key and value entry is written below: no zeroing needed.
    at::Tensor gradQkv = at::empty_like(qkv);
    float* gx = gradQkv.data_ptr<float>();
    at::Tensor gradProbs = at::empty({BH, T, T}, qkv.options());
    float* gp = gradProbs.data_ptr<float>();
    // dP = dO V^T and dV = P^T dO, per head.
    forEachHeadBlock(BH, T, rowsPerCall(T, T, d), [&](int64_t bh, int64_t r0, int64_t r) {
      const float* v = x + L.qkvOffset(bh) + 2 * d;
      const float* go = g + L.outOffset(bh);
      gemm(false, true, r, T, d, 1.0f, go + r0 * L.outRow(), L.outRow(), v, L.qkvRow(), 0.0f,
           gp + L.scoreOffset(bh) + r0 * T, T);
      gemm(true, false, r, d, T, 1.0f, p + L.scoreOffset(bh) + r0, T, go, L.outRow(), 0.0f,
           gx + L.qkvOffset(bh) + 2 * d + r0 * L.qkvRow(), L.qkvRow());
    });
    // Through the dropout, then the softmax (masked entries have P = 0, so
    // their gradient is 0).
    if (noise.defined()) gradProbs.mul_(noise);
    at::Tensor gradScores = ctx->saved_data["fused_softmax"].toBool()
                                ? fusedMaskedSoftmaxBackward(gradProbs, probs, 1.0)
                                : at::_softmax_backward_data(gradProbs, probs, -1, probs.scalar_type());
    gradProbs = at::Tensor();
    const float* gs = gradScores.data_ptr<float>();
    // dQ = scale dS K and dK = scale dS^T Q, per head.
    forEachHeadBlock(BH, T, rowsPerCall(T, d, T), [&](int64_t bh, int64_t r0, int64_t r) {
      const float* q = x + L.qkvOffset(bh);
      float* gq = gx + L.qkvOffset(bh);
      gemm(false, false, r, d, T, alpha, gs + L.scoreOffset(bh) + r0 * T, T, q + d, L.qkvRow(), 0.0f,
           gq + r0 * L.qkvRow(), L.qkvRow());
      gemm(true, false, r, d, T, alpha, gs + L.scoreOffset(bh) + r0, T, q, L.qkvRow(), 0.0f,
           gq + d + r0 * L.qkvRow(), L.qkvRow());
    });
    return {gradQkv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool hostAttentionApplies(const at::Tensor& qkv) {
  return hostKernelsEnabled() && qkv.defined() && qkv.is_cpu() && qkv.scalar_type() == at::kFloat && qkv.dim() == 3 &&
         qkv.is_contiguous() && qkv.numel() > 0 && fitsBlasInt(qkv.size(2)) && fitsBlasInt(qkv.size(1));
}

at::Tensor batchedAttention(const at::Tensor& qkv, int64_t headDim, double scale, const at::Tensor& additiveMask,
                            const std::function<at::Tensor(const at::Tensor&)>& dropProbs, bool fusedSoftmax) {
  if (computeInFloat32(HostOp::kAttention, qkv)) {
    return batchedAttention(qkv.to(at::kFloat), headDim, scale, additiveMask.to(at::kFloat), dropProbs, fusedSoftmax)
        .to(qkv.scalar_type());
  }
  const int64_t batch = qkv.size(0), length = qkv.size(1), heads = qkv.size(2) / (3 * headDim);
  // [B, T, heads, 3, d] -> [3, B, heads, T, d]; unbind, not three selects: its
  // backward stacks the three gradients once instead of scattering each into
  // a zero tensor of the whole size.
  auto parts = qkv.view({batch, length, heads, 3, headDim}).permute({3, 0, 2, 1, 4}).unbind(0);
  at::Tensor q = parts[0].reshape({batch * heads, length, headDim});
  at::Tensor k = parts[1].reshape({batch * heads, length, headDim});
  at::Tensor v = parts[2].reshape({batch * heads, length, headDim});
  at::Tensor probs;
  if (fusedSoftmax) {
    probs = fusedMaskedSoftmax(torch::bmm(q, k.transpose(1, 2)), scale, additiveMask);
  } else {
    // One batched product that also applies the scale and adds the mask.
    at::Tensor scores = torch::baddbmm(additiveMask, q, k.transpose(1, 2), /*beta=*/1.0, /*alpha=*/scale);
    probs = torch::softmax(scores, -1);
  }
  if (dropProbs) probs = dropProbs(probs);
  return torch::bmm(probs, v)  // [B * heads, T, d]
      .view({batch, heads, length, headDim})
      .permute({0, 2, 1, 3})
      .reshape({batch, length, heads * headDim});
}

bool deviceAttentionApplies(const at::Tensor& qkv) {
  return PTRAIN_TORCH_AT_LEAST(2, 1) && qkv.defined() && qkv.is_cuda() && qkv.dim() == 3;
}

at::Tensor fusedDeviceAttention(const at::Tensor& qkv, int64_t headDim, double scale, const at::Tensor& additiveMask) {
#if PTRAIN_TORCH_AT_LEAST(2, 1)
  const int64_t batch = qkv.size(0), length = qkv.size(1), heads = qkv.size(2) / (3 * headDim);
  auto parts = qkv.view({batch, length, heads, 3, headDim}).permute({3, 0, 2, 1, 4}).unbind(0);  // [B, heads, T, d]
  // The mask in the activations' dtype, broadcast over batch and heads.
  at::Tensor mask = additiveMask.to(qkv.scalar_type());
  at::Tensor out = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], mask, /*dropout_p=*/0.0,
                                                    /*is_causal=*/false, scale);
  return out.permute({0, 2, 1, 3}).reshape({batch, length, heads * headDim});
#else
  throw Error(::ptrain::detail::concat("attention: libtorch ", TORCH_VERSION, " has no fused device attention kernel"));
#endif
}

at::Tensor multiHeadAttention(const at::Tensor& qkv, int64_t headDim, double scale, const at::Tensor& additiveMask,
                              bool fusedSoftmax, const at::Tensor& probsNoise) {
  PTRAIN_CHECK(qkv.dim() == 3 && headDim > 0 && qkv.size(2) % (3 * headDim) == 0,
               "attention: qkv of shape ", qkv.sizes(), " is not [batch, length, heads * 3 * ", headDim, "]");
  PTRAIN_CHECK(additiveMask.dim() == 2 && additiveMask.size(0) == qkv.size(1) && additiveMask.size(1) == qkv.size(1),
               "attention: mask of shape ", additiveMask.sizes(), " for length ", qkv.size(1));
  if (computeInFloat32(HostOp::kAttention, qkv)) {
    return multiHeadAttention(qkv.to(at::kFloat), headDim, scale, additiveMask.to(at::kFloat), fusedSoftmax,
                              probsNoise.defined() ? probsNoise.to(at::kFloat) : probsNoise)
        .to(qkv.scalar_type());
  }
  // The host kernel gives the mask no gradient: a learned mask takes libtorch's path.
  if (hostAttentionApplies(qkv) && additiveMask.is_cpu() && additiveMask.scalar_type() == at::kFloat &&
      !additiveMask.requires_grad()) {
    return HostAttentionFn::apply(qkv, headDim, scale, additiveMask, fusedSoftmax,
                                  probsNoise.defined() ? probsNoise : at::empty({0}, qkv.options()));
  }
  if (probsNoise.defined()) {
    return batchedAttention(qkv, headDim, scale, additiveMask, [&](const at::Tensor& probs) { return probs * probsNoise; },
                            fusedSoftmax);
  }
  if (deviceAttentionApplies(qkv) && additiveMask.device() == qkv.device() && !additiveMask.requires_grad()) {
    return fusedDeviceAttention(qkv, headDim, scale, additiveMask);
  }
  return batchedAttention(qkv, headDim, scale, additiveMask, {}, fusedSoftmax);
}

}  // namespace ptrain::nn

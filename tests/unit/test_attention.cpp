// Multi-head attention: the host kernel and the libtorch-ops path against a
// per-head loop written out here, forward and backward, for odd sizes, for
// lengths that split a head's products into several BLAS calls, and over
// several threads.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "ptrain/nn/attention.h"
#include "ptrain/nn/host_kernels.h"

using ptrain::nn::batchedAttention;
using ptrain::nn::hostAttentionApplies;
using ptrain::nn::multiHeadAttention;

namespace {

// softmax(scale q k^T + mask) v for each sample and head, one at a time.
at::Tensor perHeadReference(const at::Tensor& qkv, int64_t d, double scale, const at::Tensor& mask) {
  const int64_t B = qkv.size(0), T = qkv.size(1), H = qkv.size(2) / (3 * d);
  at::Tensor x = qkv.view({B, T, H, 3, d});
  std::vector<at::Tensor> samples;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<at::Tensor> heads;
    for (int64_t h = 0; h < H; ++h) {
      at::Tensor q = x[b].select(1, h).select(1, 0), k = x[b].select(1, h).select(1, 1), v = x[b].select(1, h).select(1, 2);
      at::Tensor probs = torch::softmax(torch::matmul(q, k.t()) * scale + mask, -1);
      heads.push_back(torch::matmul(probs, v));  // [T, d]
    }
    samples.push_back(torch::cat(heads, 1));  // [T, H * d]
  }
  return torch::stack(samples);
}

at::Tensor causalMask(int64_t T) {
  return torch::full({T, T}, -std::numeric_limits<float>::infinity()).triu(1);
}

struct Grads {
  at::Tensor out, dqkv;
};

template <typename Fn>
Grads run(const at::Tensor& qkv0, const at::Tensor& upstream, Fn fn) {
  at::Tensor qkv = qkv0.detach().clone().requires_grad_(true);
  at::Tensor out = fn(qkv);
  (out * upstream).sum().backward();
  return {out.detach(), qkv.grad()};
}

void compare(int64_t B, int64_t T, int64_t H, int64_t d, const at::Tensor& mask) {
  torch::manual_seed(B * 1000 + T);
  at::Tensor qkv = torch::randn({B, T, H * 3 * d});
  at::Tensor upstream = torch::randn({B, T, H * d});
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  ASSERT_TRUE(ptrain::nn::setHostKernels(true));
  ASSERT_TRUE(hostAttentionApplies(qkv));
  auto ref = run(qkv, upstream, [&](const at::Tensor& x) { return perHeadReference(x, d, scale, mask); });
  auto host = run(qkv, upstream, [&](const at::Tensor& x) { return multiHeadAttention(x, d, scale, mask); });
  auto batched = run(qkv, upstream, [&](const at::Tensor& x) { return batchedAttention(x, d, scale, mask); });
  for (const Grads* g : {&host, &batched}) {
    EXPECT_TRUE(torch::allclose(g->out, ref.out, 1e-4, 1e-5))
        << "B " << B << " T " << T << " H " << H << " d " << d << ": output off by "
        << (g->out - ref.out).abs().max().item<double>();
    EXPECT_TRUE(torch::allclose(g->dqkv, ref.dqkv, 1e-4, 1e-5))
        << "B " << B << " T " << T << " H " << H << " d " << d << ": gradient off by "
        << (g->dqkv - ref.dqkv).abs().max().item<double>();
  }
}

}  // namespace

TEST(Attention, OddSizesCausal) { compare(2, 5, 3, 4, causalMask(5)); }

TEST(Attention, OneTokenAndOneHead) { compare(3, 1, 1, 8, causalMask(1)); }

TEST(Attention, AnyAdditiveMask) {
  torch::manual_seed(11);
  compare(2, 9, 2, 6, torch::randn({9, 9}));
}

TEST(Attention, LongSequencesSplitEachHeadIntoSeveralCalls) {
  // 200 x 200 x 64 is above the size OpenBLAS runs on one thread, so each
  // head's products go out in blocks of rows; two threads share the blocks.
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  compare(1, 200, 2, 64, causalMask(200));
  at::set_num_threads(before);
}

TEST(Attention, OtherTensorsTakeTheLibtorchPath) {
  ASSERT_TRUE(ptrain::nn::setHostKernels(true));
  at::Tensor qkv = torch::randn({2, 4, 3 * 2 * 3}, torch::kFloat64);
  EXPECT_FALSE(hostAttentionApplies(qkv));
  at::Tensor out = multiHeadAttention(qkv, 3, 0.5, causalMask(4).to(torch::kFloat64));
  EXPECT_TRUE(torch::allclose(out, perHeadReference(qkv, 3, 0.5, causalMask(4).to(torch::kFloat64)), 1e-10, 1e-12));
  EXPECT_FALSE(hostAttentionApplies(torch::randn({2, 4, 18}).transpose(0, 1)));  // not contiguous
  ptrain::nn::setHostKernels(false);
  EXPECT_FALSE(hostAttentionApplies(torch::randn({2, 4, 18})));  // kernels off
}

TEST(Attention, LearnedMaskGetsItsGradient) {
  ASSERT_TRUE(ptrain::nn::setHostKernels(true));
  torch::manual_seed(12);
  at::Tensor qkv = torch::randn({2, 6, 2 * 3 * 4});
  at::Tensor mask = torch::randn({6, 6}).requires_grad_(true);
  at::Tensor ref = mask.detach().clone().requires_grad_(true);
  multiHeadAttention(qkv, 4, 0.5, mask).sum().backward();
  perHeadReference(qkv, 4, 0.5, ref).sum().backward();
  ASSERT_TRUE(mask.grad().defined());
  EXPECT_TRUE(torch::allclose(mask.grad(), ref.grad(), 1e-4, 1e-5));
  ptrain::nn::setHostKernels(false);
}

TEST(Attention, BadShapesAreOneClearError) {
  EXPECT_THROW(multiHeadAttention(torch::randn({2, 4, 10}), 3, 1.0, causalMask(4)), ptrain::Error);
  EXPECT_THROW(multiHeadAttention(torch::randn({2, 4, 18}), 3, 1.0, causalMask(5)), ptrain::Error);
}

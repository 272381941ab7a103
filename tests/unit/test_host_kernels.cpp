// The host linear kernel against at::linear: outputs and all three gradients,
// with and without bias, for 2-D and 3-D inputs, inputs that are not
// contiguous, more rows than one thread takes, and frozen weights.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ptrain/nn/host_kernels.h"

namespace {

struct Result {
  at::Tensor y, dx, dw, db;
};

Result runLinear(bool host, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0, const at::Tensor& up,
                 bool weightGrad = true) {
  at::Tensor x = x0.detach().clone().requires_grad_(true);
  at::Tensor w = w0.detach().clone().requires_grad_(weightGrad);
  at::Tensor b = b0.defined() ? b0.detach().clone().requires_grad_(true) : at::Tensor();
  ptrain::nn::setHostKernels(host);
  at::Tensor y = ptrain::nn::linear(x, w, b);
  (y * up).sum().backward();
  ptrain::nn::setHostKernels(false);
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : at::Tensor()};
}

void expectSame(const at::Tensor& got, const at::Tensor& want, const char* what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!got.defined()) return;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << what << " off by " << (got - want).abs().max().item<double>();
}

void compare(std::vector<int64_t> xShape, int64_t out, bool bias, bool weightGrad = true) {
  torch::manual_seed(static_cast<uint64_t>(xShape.front() * 31 + out));
  at::Tensor x = torch::randn(xShape);
  at::Tensor w = torch::randn({out, xShape.back()});
  at::Tensor b = bias ? torch::randn({out}) : at::Tensor();
  std::vector<int64_t> yShape = xShape;
  yShape.back() = out;
  at::Tensor up = torch::randn(yShape);
  Result host = runLinear(true, x, w, b, up, weightGrad);
  Result ref = runLinear(false, x, w, b, up, weightGrad);
  expectSame(host.y, ref.y, "output");
  expectSame(host.dx, ref.dx, "input gradient");
  expectSame(host.dw, ref.dw, "weight gradient");
  expectSame(host.db, ref.db, "bias gradient");
}

}  // namespace

TEST(HostKernels, TurnOnWhereOpenblasIsTheBlas) {
  // Debian's libtorch links OpenBLAS (tools/install-deps.sh installs it).
  EXPECT_TRUE(ptrain::nn::setHostKernels(true));
  EXPECT_TRUE(ptrain::nn::hostKernelsEnabled());
  EXPECT_FALSE(ptrain::nn::setHostKernels(false));
  EXPECT_FALSE(ptrain::nn::hostKernelsEnabled());
}

TEST(HostKernels, LinearMatchesLibtorch) {
  compare({5, 7}, 3, true);
  compare({2, 5, 7}, 3, false);
  compare({1, 1}, 1, true);
}

TEST(HostKernels, LinearSplitsRowsAndFeaturesOverThreads) {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  compare({3, 101, 64}, 130, true);  // 303 rows, 130 features: uneven blocks
  at::set_num_threads(before);
}

TEST(HostKernels, LinearWithFrozenWeight) { compare({4, 9}, 6, true, /*weightGrad=*/false); }

TEST(HostKernels, BroadcastBiasTakesLibtorchsPath) {
  torch::manual_seed(4);
  at::Tensor x = torch::randn({5, 7}), w = torch::randn({3, 7}), b = torch::randn({1});
  ptrain::nn::setHostKernels(true);
  EXPECT_TRUE(torch::allclose(ptrain::nn::linear(x, w, b), at::linear(x, w, b), 1e-5, 1e-6));
  ptrain::nn::setHostKernels(false);
}

TEST(HostKernels, NonContiguousInputAndOtherDtypes) {
  torch::manual_seed(3);
  at::Tensor x = torch::randn({7, 4, 5}).transpose(0, 1);  // [4, 7, 5], not contiguous
  at::Tensor w = torch::randn({6, 5});
  ptrain::nn::setHostKernels(true);
  EXPECT_TRUE(torch::allclose(ptrain::nn::linear(x, w), at::linear(x, w), 1e-5, 1e-6));
  at::Tensor xd = x.to(torch::kFloat64), wd = w.to(torch::kFloat64);
  EXPECT_TRUE(torch::equal(ptrain::nn::linear(xd, wd), at::linear(xd, wd)));  // libtorch's path
  ptrain::nn::setHostKernels(false);
}

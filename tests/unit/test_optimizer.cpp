// The engine's optimizers against libtorch's own (torch::optim::AdamW and SGD,
// with the same parameter groups), the fused float32 kernel and the foreach
// path alike; clipping against torch::nn::utils::clip_grad_norm_; the
// learning-rate schedules against values worked out by hand.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ptrain/engine/optimizer.h"

using ptrain::clipCoefficient;
using ptrain::globalGradNorm;
using ptrain::learningRate;
using ptrain::OptimizerOptions;

namespace {

// torch::optim's state of parameter `p`: keyed by the address of its
// TensorImpl, written as text ("0x...") in libtorch 1.13, the pointer itself later.
template <class StateMap>
torch::optim::OptimizerParamState& stateOf(StateMap& state, const at::Tensor& p) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    std::ostringstream key;
    key << static_cast<const void*>(p.unsafeGetTensorImpl());
    return *state.at(key.str());
  } else {
    return *state.at(p.unsafeGetTensorImpl());
  }
}

// A matrix (decayed), a vector (not decayed) and an odd-sized matrix whose
// length is no multiple of any vector width, all of `dtype`.
std::vector<at::Tensor> makeParams(at::ScalarType dtype) {
  torch::manual_seed(7);
  return {torch::randn({37, 53}).to(dtype).requires_grad_(true), torch::randn({53}).to(dtype).requires_grad_(true),
          torch::randn({3, 1031}).to(dtype).requires_grad_(true)};
}

std::vector<at::Tensor> cloneParams(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> named(const std::vector<at::Tensor>& params) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < params.size(); ++i) out.emplace_back("p" + std::to_string(i), params[i]);
  return out;
}

// Gradients of step `step`, the same for both copies of the parameters.
void setGrads(const std::vector<at::Tensor>& params, int step) {
  torch::manual_seed(100 + step);
  for (const auto& p : params) {
    at::Tensor g = torch::randn(p.sizes()).to(p.scalar_type()) * (0.1 * (step + 1));
    p.mutable_grad() = g;
  }
}

// Two groups as ptrain decays them: matrices with weight decay, vectors without.
std::vector<torch::optim::OptimizerParamGroup> groups(const std::vector<at::Tensor>& params,
                                                     std::unique_ptr<torch::optim::OptimizerOptions> decayed,
                                                     std::unique_ptr<torch::optim::OptimizerOptions> plain) {
  std::vector<at::Tensor> withDecay, without;
  for (const auto& p : params) (p.dim() >= 2 ? withDecay : without).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> out;
  out.emplace_back(withDecay, std::move(decayed));
  out.emplace_back(without, std::move(plain));
  return out;
}

void expectClose(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], want[i], rtol, atol))
        << "parameter " << i << ": max difference " << (got[i] - want[i]).abs().max().item<double>();
  }
}

OptimizerOptions adamwOptions() {
  OptimizerOptions o;
  o.name = "adamw";
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  o.beta1 = 0.85;
  o.beta2 = 0.99;
  o.eps = 1e-6;
  return o;
}

// ptrain's AdamW and libtorch's over six steps; `scale` multiplies every
// gradient on ptrain's side through step()'s gradScale and on the
// reference's side directly.
void compareAdamw(at::ScalarType dtype, double scale, double rtol, double atol) {
  const OptimizerOptions o = adamwOptions();
  auto mine = makeParams(dtype);
  auto ref = cloneParams(mine);
  auto optimizer = ptrain::makeOptimizer(named(mine), o);
  auto makeOptions = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(wd));
  };
  torch::optim::AdamW reference(groups(ref, makeOptions(o.weight_decay), makeOptions(0.0)));
  for (int step = 0; step < 6; ++step) {
    setGrads(mine, step);
    setGrads(ref, step);
    {
      torch::NoGradGuard noGrad;
      for (auto& p : ref) p.mutable_grad().mul_(scale);
    }
    optimizer->step(o.lr, scale);
    reference.step();
  }
  expectClose(mine, ref, rtol, atol);
  // The moments are what a checkpoint saves: they match as well.
  auto state = optimizer->state();
  const auto& refState =
      static_cast<torch::optim::AdamWParamState&>(stateOf(reference.state(), ref[0]));
  EXPECT_TRUE(torch::allclose(state[0].second, refState.exp_avg(), rtol, atol));
  EXPECT_TRUE(torch::allclose(state[1].second, refState.exp_avg_sq(), rtol, atol));
}

}  // namespace

TEST(Optimizer, FusedAdamwMatchesLibtorchAdamw) {
  // float32 tensors take the fused one-pass kernel.
  compareAdamw(torch::kFloat32, 1.0, 1e-5, 1e-6);
}

TEST(Optimizer, FusedAdamwAppliesTheGradientScale) { compareAdamw(torch::kFloat32, 0.37, 1e-5, 1e-6); }

TEST(Optimizer, ForeachAdamwMatchesLibtorchAdamw) {
  // float64 tensors go through the foreach kernels.
  compareAdamw(torch::kFloat64, 0.37, 1e-12, 1e-14);
}

TEST(Optimizer, FusedAdamwSplitsLargeTensorsAcrossThreads) {
  // Longer than one parallel task (32k floats): the ranges handed to the
  // threads must tile the tensor exactly.
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  OptimizerOptions o = adamwOptions();
  torch::manual_seed(3);
  at::Tensor p = torch::randn({100003}).requires_grad_(true);
  at::Tensor ref = p.detach().clone().requires_grad_(true);
  auto optimizer = ptrain::makeOptimizer({{"w", p}}, o);
  torch::optim::AdamW reference(std::vector<at::Tensor>{ref},
                                torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(0.0));
  for (int step = 0; step < 3; ++step) {
    setGrads({p}, step);
    setGrads({ref}, step);
    optimizer->step(o.lr);
    reference.step();
  }
  at::set_num_threads(before);
  expectClose({p}, {ref}, 1e-5, 1e-6);
}

TEST(Optimizer, ParametersWithoutGradientAreLeftAlone) {
  auto params = makeParams(torch::kFloat32);
  auto optimizer = ptrain::makeOptimizer(named(params), adamwOptions());
  const at::Tensor before = params[1].detach().clone();
  setGrads(params, 0);
  params[1].mutable_grad() = at::Tensor();
  optimizer->step(1e-2);
  EXPECT_TRUE(torch::equal(params[1], before));
  EXPECT_FALSE(torch::equal(params[0], makeParams(torch::kFloat32)[0]));
}

TEST(Optimizer, SgdWithMomentumAndWeightDecayMatchesLibtorchSgd) {
  OptimizerOptions o;
  o.name = "sgd";
  o.lr = 0.05;
  o.weight_decay = 0.01;
  o.momentum = 0.9;
  for (double momentum : {0.0, 0.9}) {
    o.momentum = momentum;
    auto mine = makeParams(torch::kFloat32);
    auto ref = cloneParams(mine);
    auto optimizer = ptrain::makeOptimizer(named(mine), o);
    auto makeOptions = [&](double wd) {
      return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(o.lr).momentum(momentum).weight_decay(wd));
    };
    torch::optim::SGD reference(groups(ref, makeOptions(o.weight_decay), makeOptions(0.0)), torch::optim::SGDOptions(o.lr));
    for (int step = 0; step < 5; ++step) {
      setGrads(mine, step);
      setGrads(ref, step);
      optimizer->step(o.lr);
      reference.step();
    }
    expectClose(mine, ref, 1e-5, 1e-6);
  }
}

TEST(Optimizer, ClippingMatchesLibtorchClipGradNorm) {
  auto mine = makeParams(torch::kFloat32);
  auto ref = cloneParams(mine);
  setGrads(mine, 4);
  setGrads(ref, 4);
  // By hand: the square root of every gradient's sum of squares.
  double sumSquares = 0;
  for (const auto& p : mine) sumSquares += p.grad().to(torch::kFloat64).pow(2).sum().item<double>();
  const double norm = globalGradNorm(mine);
  EXPECT_NEAR(norm, std::sqrt(sumSquares), 1e-6 * norm);  // per-tensor norms are float32

  const double maxNorm = 0.5;
  const double refNorm = torch::nn::utils::clip_grad_norm_(ref, maxNorm);
  EXPECT_NEAR(norm, refNorm, 1e-5 * norm);
  const double coefficient = clipCoefficient(norm, maxNorm);
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_TRUE(torch::allclose(mine[i].grad() * coefficient, ref[i].grad(), 1e-5, 1e-7)) << i;
  }
  EXPECT_EQ(clipCoefficient(norm, 0.0), 1.0);         // clipping off
  EXPECT_EQ(clipCoefficient(norm, 2 * norm), 1.0);    // under the limit
}

TEST(Optimizer, NormCountsOnlyTheMarkedParametersAndUsesTheGlobalSum) {
  auto params = makeParams(torch::kFloat32);
  setGrads(params, 1);
  const double first = params[0].grad().to(torch::kFloat64).pow(2).sum().item<double>();
  // Only the first counted, and the "other ranks" add 3.0 to the sum of squares.
  const double norm = globalGradNorm(params, [](at::Tensor& total) { total.add_(3.0); }, {true, false, false});
  EXPECT_NEAR(norm, std::sqrt(first + 3.0), 1e-6 * norm);
}

TEST(Optimizer, LearningRateSchedules) {
  OptimizerOptions o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  o.total_steps = 14;
  o.schedule = "constant";
  // Warmup: (step + 1) / warmup of the peak.
  EXPECT_DOUBLE_EQ(learningRate(o, 0), 0.25);
  EXPECT_DOUBLE_EQ(learningRate(o, 3), 1.0);
  EXPECT_DOUBLE_EQ(learningRate(o, 9), 1.0);
  // Linear: from lr at the end of warmup to min_lr at total_steps (10 steps of decay).
  o.schedule = "linear";
  EXPECT_DOUBLE_EQ(learningRate(o, 4), 1.0);
  EXPECT_NEAR(learningRate(o, 9), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_NEAR(learningRate(o, 14), 0.1, 1e-12);
  // Cosine: halfway down at the middle, min_lr at the end.
  o.schedule = "cosine";
  EXPECT_NEAR(learningRate(o, 9), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_NEAR(learningRate(o, 6), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.2)), 1e-12);
  EXPECT_NEAR(learningRate(o, 14), 0.1, 1e-12);
}

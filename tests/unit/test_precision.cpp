// Precision: ops on half-precision host tensors where libtorch has no kernel
// (host_fallback.h), the precision plugins through ModelRuntime (bf16 and
// fp16 parameters, float32 master weights and gradient accumulation), the
// fp16 overflow veto across ranks, and every layout in low precision against
// the single-rank run in the same precision.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <memory>
#include <set>

#include "ptrain/engine/optimizer.h"
#include "ptrain/engine/precision.h"
#include "ptrain/nn/attention.h"
#include "ptrain/nn/cross_entropy.h"
#include "ptrain/nn/host_fallback.h"
#include "ptrain/nn/host_kernels.h"
#include "ptrain/nn/ops.h"
#include "support/test_support.h"
#include "unit/llm_runtime_fixture.h"

namespace ptrain {
namespace {

using namespace llm_fixture;

// ---- ops on half-precision host tensors ----

// An op on float tensors (requires_grad leaves) returning one tensor.
using Op = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// Runs `op` on `inputs` cast to `dtype` and on the same (rounded) values in
// float32; the outputs and the gradients of every input must agree within
// `tol` relative to the float32 result's largest magnitude.
void expectLikeFloat32(const Op& op, const std::vector<at::Tensor>& inputs, at::ScalarType dtype, double tol,
                       const std::string& what) {
  std::vector<at::Tensor> low, high;
  for (const auto& t : inputs) {
    at::Tensor rounded = t.to(dtype);
    low.push_back(rounded.clone().requires_grad_(t.is_floating_point()));
    high.push_back(rounded.to(at::kFloat).requires_grad_(t.is_floating_point()));
  }
  at::Tensor outLow, outHigh;
  ASSERT_NO_THROW(outLow = op(low)) << what;
  outHigh = op(high);
  const double scale = std::max(1e-3, outHigh.abs().max().item<double>());
  EXPECT_LT((outLow.to(at::kFloat) - outHigh).abs().max().item<double>() / scale, tol) << what << " forward";
  // A fixed upstream gradient, the same for both.
  at::Tensor upstream = torch::linspace(-1, 1, outHigh.numel()).view(outHigh.sizes());
  ASSERT_NO_THROW((outLow.to(at::kFloat) * upstream).sum().backward()) << what;
  (outHigh * upstream).sum().backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].is_floating_point()) continue;
    ASSERT_TRUE(low[i].grad().defined()) << what << " input " << i;
    EXPECT_EQ(low[i].grad().scalar_type(), dtype) << what << " input " << i;
    const double g = std::max(1e-3, high[i].grad().abs().max().item<double>());
    EXPECT_LT((low[i].grad().to(at::kFloat) - high[i].grad()).abs().max().item<double>() / g, tol)
        << what << " gradient of input " << i;
  }
}

class HalfOnHost : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(HalfOnHost, EveryLayerOpRunsAndMatchesFloat32) {
  const at::ScalarType dtype = GetParam();
  // bf16 keeps 8 bits of mantissa, fp16 11.
  const double tol = dtype == at::kBFloat16 ? 5e-2 : 1e-2;
  torch::manual_seed(3);
  for (bool hostKernels : {false, true}) {
    nn::setHostKernels(hostKernels);
    const std::string mode = hostKernels ? " (host kernels)" : " (libtorch ops)";
    expectLikeFloat32([](const auto& in) { return nn::linear(in[0], in[1], in[2]); },
                      {torch::randn({2, 5, 7}), torch::randn({3, 7}), torch::randn({3})}, dtype, tol, "linear" + mode);
    expectLikeFloat32([](const auto& in) { return nn::layerNorm(in[0], in[1], in[2], 1e-5); },
                      {torch::randn({4, 9}), torch::randn({9}), torch::randn({9})}, dtype, tol, "layer_norm" + mode);
    expectLikeFloat32([](const auto& in) { return nn::gelu(in[0]); }, {torch::randn({3, 11})}, dtype, tol,
                      "gelu" + mode);
    // Causal mask, 2 heads of 4: odd length 5.
    at::Tensor mask = torch::full({5, 5}, -std::numeric_limits<float>::infinity()).triu(1);
    expectLikeFloat32([&](const auto& in) { return nn::multiHeadAttention(in[0], 4, 0.5, mask.to(in[0].scalar_type())); },
                      {torch::randn({2, 5, 24})}, dtype, tol, "attention" + mode);
  }
  nn::setHostKernels(false);
  // Cross-entropy in the logits' dtype (fp16_lm_cross_entropy) and in float32.
  at::Tensor targets = torch::tensor({{1, 0, 6}, {2, 5, 3}}, torch::kInt64);
  for (bool inLogitsDtype : {false, true}) {
    expectLikeFloat32([&](const auto& in) { return nn::vocabParallelCrossEntropy(in[0], targets, 7, nullptr, inLogitsDtype); },
                      {torch::randn({2, 3, 8})}, dtype, tol, inLogitsDtype ? "cross_entropy (half)" : "cross_entropy");
  }
  // Dropout: the kept entries scaled by 1 / (1 - p), in the input's dtype.
  at::Tensor x = torch::ones({64, 64}).to(dtype);
  at::Tensor dropped;
  ASSERT_NO_THROW(dropped = nn::dropout(x, 0.5, true));
  EXPECT_EQ(dropped.scalar_type(), dtype);
  at::Tensor kept = dropped.to(at::kFloat);
  EXPECT_TRUE(((kept == 0).logical_or(kept == 2)).all().item<bool>());
  EXPECT_NEAR(kept.mean().item<double>(), 1.0, 0.1);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HalfOnHost, ::testing::Values(at::kHalf, at::kBFloat16),
                         [](const auto& info) { return std::string(info.param == at::kHalf ? "fp16" : "bf16"); });

TEST(HostFallback, FloatNeverFallsBackAndMissingKernelsAreNamed) {
  EXPECT_FALSE(nn::computeInFloat32(nn::HostOp::kLinear, torch::ones({2}, torch::kFloat32)));
  EXPECT_TRUE(nn::missingHostKernels(at::kFloat).empty());
  // Every op named missing for fp16 really is refused by libtorch on the host.
  for (const auto& name : nn::missingHostKernels(at::kHalf)) {
    EXPECT_TRUE(name == "linear" || name == "layer_norm" || name == "gelu" || name == "attention" ||
                name == "dropout" || name == "cross_entropy")
        << name;
  }
  bool linearMissing = false;
  try {
    at::linear(torch::ones({2, 2}, torch::kHalf), torch::ones({2, 2}, torch::kHalf));
  } catch (const c10::Error&) {
    linearMissing = true;
  }
  EXPECT_EQ(nn::computeInFloat32(nn::HostOp::kLinear, torch::ones({2}, torch::kHalf)), linearMissing);
}

// ---- the precision plugins through the runtime ----

// Records the dtypes of the gradients the optimizer will see.
struct GradientDtypes : StepHooks {
  std::set<at::ScalarType> seen;
  const std::vector<at::Tensor>* params = nullptr;
  bool mayStep(const GradientCheck& check) override {
    for (const auto& p : *check.parameters)
      if (p.grad().defined()) seen.insert(p.grad().scalar_type());
    return true;
  }
};

class LowPrecision : public ::testing::TestWithParam<std::string> {};

TEST_P(LowPrecision, TrainsLikeFloat32WithFloat32MastersAndGradients) {
  const std::string precision = GetParam();
  const at::ScalarType dtype = precision == "bf16" ? at::kBFloat16 : at::kHalf;
  llm::LlmTrainer trainer{PluginContext{}};
  Recipe fp32 = llmRecipe(trainer, {});
  trainer.setup(fp32);
  const std::vector<double> reference = singleRankLosses(trainer, fp32);

  std::vector<std::string> overrides{"precision.name=" + precision};
  if (precision == "fp16") overrides.push_back("precision.initial_loss_scale=4096");
  Recipe recipe = llmRecipe(trainer, overrides);
  auto comm = Communicator::loopback();
  ModelRuntime rt(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                  llmOptions(recipe, comm->layout(), true));
  EXPECT_EQ(rt.precision().dtype(), dtype);
  auto dtypes = std::make_shared<GradientDtypes>();
  rt.addHooks(dtypes);
  for (const auto& p : rt.model().module().parameters()) EXPECT_EQ(p.scalar_type(), dtype);
  const Optimizer& opt = *rt.optimizer();
  for (size_t i = 0; i < opt.parameters().size(); ++i) {
    ASSERT_TRUE(opt.master(i).defined()) << opt.parameterNames()[i];
    EXPECT_EQ(opt.master(i).scalar_type(), at::kFloat);
  }
  for (int step = 0; step < 3; ++step) {
    StepResult r = llmStep(rt, trainer, step, 4);  // two micro-batches: accumulation
    EXPECT_TRUE(r.applied) << "step " << step;
    EXPECT_LT(test::relDiff(r.loss, reference[static_cast<size_t>(step)]), 2e-2) << "step " << step;
    if (precision == "fp16") {
      EXPECT_EQ(r.loss_scale, 4096.0);
      EXPECT_EQ(r.stats.at("loss_scale"), 4096.0);
      EXPECT_EQ(r.stats.at("skipped_steps"), 0.0);
    }
  }
  EXPECT_EQ(dtypes->seen, (std::set<at::ScalarType>{at::kFloat}));
  // The parameters are the masters rounded to the storage dtype.
  for (size_t i = 0; i < opt.parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(opt.parameters()[i], opt.master(i).to(dtype))) << opt.parameterNames()[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Plugins, LowPrecision, ::testing::Values("bf16", "fp16"));

TEST(Fp16, TheDefaultScaleOverflowsAndBacksOffAsMegatrons) {
  // From 2^32 every step overflows until the scale fits fp16: the first
  // overflow only spends the hysteresis, every further one halves the scale.
  llm::LlmTrainer trainer{PluginContext{}};
  Recipe recipe = llmRecipe(trainer, {"precision.name=fp16"});
  trainer.setup(recipe);
  auto comm = Communicator::loopback();
  ModelRuntime rt(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                  llmOptions(recipe, comm->layout(), true));
  LossScaler shadow(PrecisionSettings::fromRecipe(recipe).scalerOptions());
  int skipped = 0;
  for (int step = 0; step < 40; ++step) {
    StepResult r = llmStep(rt, trainer, step, 0);
    EXPECT_EQ(r.loss_scale, shadow.scale()) << "step " << step;
    EXPECT_EQ(r.applied, std::isfinite(r.grad_norm)) << "step " << step;
    skipped += r.applied ? 0 : 1;
    EXPECT_EQ(r.stats.at("skipped_steps"), skipped);
    shadow.update(!r.applied);
  }
  EXPECT_GT(skipped, 2);
  EXPECT_LT(shadow.scale(), 65536.0f);
  EXPECT_EQ(rt.optimizer()->stepCount(), 40 - skipped);
}

// Puts inf into one gradient of one rank at one step, before the reductions.
struct InjectInf : StepHooks {
  int64_t atStep;
  int64_t current = -1;
  StagedModel* model;
  InjectInf(int64_t step, StagedModel* m) : atStep(step), model(m) {}
  void beginStep(const StepInfo& info) override { current = info.step; }
  void finishGradients() override {
    if (current != atStep) return;
    for (auto& [name, p] : model->localParameters()) {
      if (p.grad().defined() && p.dim() == 2) {
        p.mutable_grad().view(-1)[0] = std::numeric_limits<float>::infinity();
        return;
      }
    }
  }
};

TEST(Fp16, AnInfOnOneRankSkipsThatStepOnEveryRank) {
  // dp2 x tp2: the inf reaches one rank's tensor-parallel shard (and, by the
  // data-parallel sum, its dp peer); the other tp rank learns of it only
  // through the overflow flag.
  std::string failures = test::runRanks(4, [](int rank, int size, int port) {
    llm::LlmTrainer trainer{PluginContext{}};
    // Without overlap the data-parallel sums run in finishGradients, after
    // the injection (an overlapped reduction would already be under way).
    Recipe recipe = llmRecipe(trainer, {"precision.name=fp16", "precision.initial_loss_scale=1024",
                                        "parallel.tensor_model_parallel_size=2", "parallel.overlap_grad_reduce=false",
                                        "train.steps=6"});
    trainer.setup(recipe);
    constexpr int kInjected = 2;
    // The reference: the same ranks and layout, without step 2 at all.
    auto comm = worldOf(rank, size, port, layoutOf(4, 2, 1));
    std::vector<double> reference(6, 0.0);
    {
      ModelRuntime rt(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                      llmOptions(recipe, comm->layout(), true));
      for (int step = 0; step < 6; ++step)
        if (step != kInjected) reference[step] = llmStep(rt, trainer, step, 2).loss;
    }
    ModelRuntime rt(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                    llmOptions(recipe, comm->layout(), true));
    if (rank == 1) rt.addHooks(std::make_shared<InjectInf>(kInjected, &rt.model()));
    for (int step = 0; step < 6; ++step) {
      StepResult r = llmStep(rt, trainer, step, 2);
      EXPECT_EQ(r.applied, step != kInjected) << "rank " << rank << " step " << step;
      EXPECT_EQ(r.stats.at("skipped_steps"), step < kInjected ? 0.0 : 1.0) << "rank " << rank << " step " << step;
      // The first overflow spends the hysteresis: the scale stays.
      EXPECT_EQ(r.loss_scale, 1024.0);
      if (step != kInjected) {
        EXPECT_EQ(r.loss, reference[step]) << "rank " << rank << " step " << step;
      }
    }
    EXPECT_EQ(rt.optimizer()->stepCount(), 5);
  });
  EXPECT_EQ(failures, "");
}

// Every parallel plugin in bf16 and fp16: three steps of a layout against
// the same steps of the whole model on one rank in the same precision.
struct PrecisionLayout {
  std::string precision;
  int world, tp, pp;
  bool sequenceParallel;
};

class LowPrecisionLayouts : public ::testing::TestWithParam<PrecisionLayout> {};

TEST_P(LowPrecisionLayouts, ThreeStepsMatchOneRank) {
  const PrecisionLayout c = GetParam();
  std::string failures = test::runRanks(c.world, [c](int rank, int size, int port) {
    llm::LlmTrainer trainer{PluginContext{}};
    std::vector<std::string> overrides = layoutOverrides(c.tp, c.pp, c.sequenceParallel);
    overrides.push_back("precision.name=" + c.precision);
    if (c.precision == "fp16") overrides.push_back("precision.initial_loss_scale=4096");
    Recipe recipe = llmRecipe(trainer, overrides);
    trainer.setup(recipe);
    const std::vector<double> reference = singleRankLosses(trainer, recipe);
    // Sums split over ranks round differently in half precision.
    expectLayoutMatches(rank, size, port, trainer, recipe, c.tp, c.pp, reference, [](int) { return 1e-2; });
  });
  EXPECT_EQ(failures, "");
}

INSTANTIATE_TEST_SUITE_P(Plugins, LowPrecisionLayouts,
                         ::testing::Values(PrecisionLayout{"bf16", 2, 1, 1, false}, PrecisionLayout{"bf16", 4, 2, 2, true},
                                           PrecisionLayout{"fp16", 2, 2, 1, false}, PrecisionLayout{"fp16", 4, 2, 2, true}),
                         [](const ::testing::TestParamInfo<PrecisionLayout>& info) {
                           const PrecisionLayout& c = info.param;
                           return c.precision + "_world" + std::to_string(c.world) + "_tp" + std::to_string(c.tp) +
                                  "_pp" + std::to_string(c.pp) + (c.sequenceParallel ? "_sp" : "");
                         });

}  // namespace
}  // namespace ptrain

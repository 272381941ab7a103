// Fused kernels (nn/fused.h) against the libtorch composition they replace,
// forward and backward, in float32 (within 1e-6), bf16 and fp16 (within the
// dtype's rounding), on odd shapes, with masks that mask whole rows; and the
// GPT with every fusion on against the same GPT without, dropout included.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ptrain/nn/attention.h"
#include "ptrain/nn/fused.h"
#include "ptrain/nn/host_kernels.h"
#include "support/test_support.h"
#include "unit/llm_runtime_fixture.h"

namespace ptrain {
namespace {

using namespace llm_fixture;

using Fn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

double tolerance(at::ScalarType dtype) {
  switch (dtype) {
    // Gradients of parameters sum a row's worth of rounded terms.
    case at::kBFloat16: return 5e-2;
    case at::kHalf: return 6e-3;
    default: return 1e-6;
  }
}

// Runs `fused` on the inputs in `dtype` and `reference` (libtorch's ops) on
// the same values in float64, so the reference carries no rounding of its
// own; every output and every input's gradient (for fixed upstream
// gradients) must agree within the dtype's tolerance, relative to the
// largest magnitude of the reference.
void expectSameFunction(const Fn& fused, const Fn& reference, const std::vector<at::Tensor>& inputs,
                        at::ScalarType dtype, const std::string& what) {
  std::vector<at::Tensor> a, b;
  for (const auto& t : inputs) {
    at::Tensor rounded = t.to(dtype).to(at::kFloat);
    a.push_back(rounded.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true));
    b.push_back(rounded.to(at::kDouble, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true));
  }
  auto outA = fused(a);
  auto outB = reference(b);
  ASSERT_EQ(outA.size(), outB.size()) << what;
  at::Tensor lossA = torch::zeros({}), lossB = torch::zeros({}, torch::kDouble);
  for (size_t i = 0; i < outA.size(); ++i) {
    ASSERT_EQ(outA[i].scalar_type(), dtype) << what << " output " << i;
    const double scale = std::max(1.0, outB[i].abs().max().item<double>());
    EXPECT_LE((outA[i].to(at::kDouble) - outB[i]).abs().max().item<double>(), tolerance(dtype) * scale)
        << what << " output " << i;
    at::Tensor upstream = torch::sin(torch::arange(outB[i].numel(), torch::kFloat) * 0.37 + static_cast<double>(i)).view(outB[i].sizes());
    lossA = lossA + (outA[i].to(at::kFloat) * upstream).sum();
    lossB = lossB + (outB[i] * upstream.to(at::kDouble)).sum();
  }
  lossA.backward();
  lossB.backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(a[i].grad().defined() && b[i].grad().defined()) << what << " gradient " << i;
    const double scale = std::max(1.0, b[i].grad().abs().max().item<double>());
    EXPECT_LE((a[i].grad().to(at::kDouble) - b[i].grad()).abs().max().item<double>(), tolerance(dtype) * scale)
        << what << " gradient of input " << i;
  }
}

const at::ScalarType kDtypes[] = {at::kFloat, at::kBFloat16, at::kHalf};

std::string name(at::ScalarType dtype) { return dtype == at::kFloat ? "fp32" : dtype == at::kHalf ? "fp16" : "bf16"; }

// A causal mask over [queries, keys] whose row `emptyRow` masks every key.
at::Tensor maskWithAnEmptyRow(int64_t queries, int64_t keys, int64_t emptyRow) {
  at::Tensor mask = torch::full({queries, keys}, -std::numeric_limits<float>::infinity()).triu(1);
  mask[emptyRow].fill_(-std::numeric_limits<float>::infinity());
  return mask;
}

// libtorch's softmax, with the rows that mask everything set to zero.
at::Tensor referenceSoftmax(const at::Tensor& scores, double scale, const at::Tensor& mask) {
  at::Tensor z = scores * scale + mask.to(scores.scalar_type());
  at::Tensor empty = (z == -std::numeric_limits<float>::infinity()).all(-1, true);
  return torch::softmax(z.masked_fill(empty, 0), -1).masked_fill(empty, 0);
}

TEST(FusedKernels, MaskedSoftmaxMatchesSoftmaxOfTheMaskedScores) {
  torch::manual_seed(1);
  for (at::ScalarType dtype : kDtypes) {
    for (auto shape : {std::vector<int64_t>{2, 3, 5, 7}, std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{4, 33, 65}}) {
      const int64_t q = shape[shape.size() - 2], k = shape.back();
      at::Tensor mask = q > 2 ? maskWithAnEmptyRow(q, k, 2) : torch::zeros({q, k});
      expectSameFunction([&](const auto& in) { return std::vector<at::Tensor>{nn::fusedMaskedSoftmax(in[0], 0.3, mask)}; },
                         [&](const auto& in) { return std::vector<at::Tensor>{referenceSoftmax(in[0], 0.3, mask)}; },
                         {torch::randn(shape) * 3}, dtype, "masked softmax " + name(dtype));
    }
  }
  // A fully masked row is zeros, not NaN, and passes no gradient.
  at::Tensor scores = torch::randn({2, 4, 4}).requires_grad_(true);
  at::Tensor probs = nn::fusedMaskedSoftmax(scores, 1.0, maskWithAnEmptyRow(4, 4, 1));
  EXPECT_TRUE(probs.select(1, 1).eq(0).all().item<bool>());
  probs.sum().backward();
  EXPECT_TRUE(scores.grad().isfinite().all().item<bool>());
}

TEST(FusedKernels, BiasGeluMatchesGeluOfTheSum) {
  torch::manual_seed(2);
  for (at::ScalarType dtype : kDtypes) {
    for (auto shape : {std::vector<int64_t>{3, 5, 17}, std::vector<int64_t>{130, 1}, std::vector<int64_t>{2, 9}}) {
      expectSameFunction(
          [](const auto& in) { return std::vector<at::Tensor>{nn::fusedBiasGelu(in[0], in[1])}; },
          [](const auto& in) { return std::vector<at::Tensor>{torch::gelu(in[0] + in[1], "tanh")}; },
          {torch::randn(shape) * 2, torch::randn({shape.back()})}, dtype, "bias gelu " + name(dtype));
    }
    // Rows wide enough for the vector loops, values far into both tails (where
    // tanh is +-1 and exp(-2|z|) underflows), and no bias.
    expectSameFunction([](const auto& in) { return std::vector<at::Tensor>{nn::fusedBiasGelu(in[0], at::Tensor())}; },
                       [](const auto& in) { return std::vector<at::Tensor>{torch::gelu(in[0], "tanh")}; },
                       {torch::randn({5, 67}) * 6}, dtype, "gelu without bias " + name(dtype));
  }
}

TEST(FusedKernels, BiasDropoutAddMatchesTheThreeOps) {
  torch::manual_seed(3);
  for (at::ScalarType dtype : kDtypes) {
    for (auto shape : {std::vector<int64_t>{3, 5, 17}, std::vector<int64_t>{129, 3}}) {
      at::Tensor noise = nn::dropoutNoise(torch::empty(shape).to(dtype), 0.25);
      at::Tensor noise32 = noise.to(at::kFloat);
      expectSameFunction(
          [&](const auto& in) { return std::vector<at::Tensor>{nn::fusedBiasDropoutAdd(in[0], in[1], in[2], noise)}; },
          [&](const auto& in) { return std::vector<at::Tensor>{in[2] + (in[0] + in[1]) * noise32.to(at::kDouble)}; },
          {torch::randn(shape), torch::randn({shape.back()}), torch::randn(shape)}, dtype,
          "bias dropout add " + name(dtype));
      expectSameFunction(
          [&](const auto& in) { return std::vector<at::Tensor>{nn::fusedBiasDropoutAdd(in[0], in[1], in[2], {})}; },
          [&](const auto& in) { return std::vector<at::Tensor>{in[2] + (in[0] + in[1])}; },
          {torch::randn(shape), torch::randn({shape.back()}), torch::randn(shape)}, dtype,
          "bias add (no dropout) " + name(dtype));
    }
  }
}

TEST(FusedKernels, DropoutNoiseIsTheMaskTorchDropoutDraws) {
  at::Tensor ones = torch::ones({7, 33});
  torch::manual_seed(9);
  at::Tensor dropped = torch::dropout(ones, 0.3, true);
  torch::manual_seed(9);
  EXPECT_TRUE(torch::equal(nn::dropoutNoise(ones, 0.3), dropped));
  // A shard keeps its slice of the whole tensor's noise.
  torch::manual_seed(9);
  at::Tensor whole = nn::dropoutNoise(torch::ones({4, 6}), 0.3);
  torch::manual_seed(9);
  EXPECT_TRUE(torch::equal(nn::dropoutNoise(torch::ones({4, 3}), 0.3, 1, 2, 1), whole.narrow(1, 3, 3)));
}

TEST(FusedKernels, AddLayerNormMatchesLayerNormOfTheSum) {
  torch::manual_seed(4);
  for (at::ScalarType dtype : kDtypes) {
    for (auto shape : {std::vector<int64_t>{3, 5, 17}, std::vector<int64_t>{130, 64}, std::vector<int64_t>{1, 1}}) {
      const int64_t h = shape.back();
      expectSameFunction(
          [](const auto& in) {
            auto [y, sum] = nn::fusedAddLayerNorm(in[0], in[1], in[2], in[3], 1e-5);
            return std::vector<at::Tensor>{y, sum};
          },
          [h](const auto& in) {
            at::Tensor sum = in[0] + in[1];
            return std::vector<at::Tensor>{at::layer_norm(sum, {h}, in[2], in[3], 1e-5), sum};
          },
          {torch::randn(shape) * 2 + 1, torch::randn(shape), torch::randn({h}), torch::randn({h})}, dtype,
          "add layernorm " + name(dtype));
      expectSameFunction(
          [](const auto& in) { return std::vector<at::Tensor>{nn::fusedAddLayerNorm(in[0], {}, in[1], in[2], 1e-5).first}; },
          [h](const auto& in) { return std::vector<at::Tensor>{at::layer_norm(in[0], {h}, in[1], in[2], 1e-5)}; },
          {torch::randn(shape) * 3, torch::randn({h}), torch::randn({h})}, dtype, "layernorm " + name(dtype));
    }
  }
}

// The attention paths with the fused softmax: the host kernel and libtorch's
// ops, against libtorch's ops unfused.
TEST(FusedKernels, AttentionWithTheFusedSoftmaxIsTheSameAttention) {
  torch::manual_seed(5);
  at::Tensor mask = torch::full({7, 7}, -std::numeric_limits<float>::infinity()).triu(1);
  for (bool hostKernels : {true, false}) {
    nn::setHostKernels(hostKernels);
    expectSameFunction(
        [&](const auto& in) { return std::vector<at::Tensor>{nn::multiHeadAttention(in[0], 4, 0.5, mask, true)}; },
        [&](const auto& in) { return std::vector<at::Tensor>{nn::batchedAttention(in[0], 4, 0.5, mask.to(in[0].scalar_type()))}; },
        {torch::randn({3, 7, 36})}, at::kFloat, hostKernels ? "host attention" : "libtorch attention");
  }
  // With attention dropout: the host kernel applies the noise itself.
  nn::setHostKernels(true);
  at::Tensor noise = nn::dropoutNoise(torch::empty({3 * 3, 7, 7}), 0.2);
  expectSameFunction(
      [&](const auto& in) { return std::vector<at::Tensor>{nn::multiHeadAttention(in[0], 4, 0.5, mask, true, noise)}; },
      [&](const auto& in) {
        at::Tensor n = noise.to(in[0].scalar_type());
        return std::vector<at::Tensor>{nn::batchedAttention(in[0], 4, 0.5, mask.to(in[0].scalar_type()),
                                                            [&](const at::Tensor& p) { return p * n; })};
      },
      {torch::randn({3, 7, 36})}, at::kFloat, "host attention with dropout");
  nn::setHostKernels(false);
}

// The GPT with every fusion on trains the GPT without: dropout draws the
// same masks, and the losses of five steps agree within 1e-6.
TEST(FusedKernels, GptWithEveryFusionTrainsLikeWithout) {
  for (bool hostKernels : {true, false}) {
    nn::setHostKernels(hostKernels);
    std::vector<std::vector<double>> losses;
    for (bool fused : {false, true}) {
      llm::LlmTrainer trainer{PluginContext{}};
      std::vector<std::string> overrides{"model.dropout=0.1"};
      for (const char* k : {"masked_softmax", "bias_gelu", "layernorm", "bias_dropout_add"}) {
        overrides.push_back(std::string("fusion.") + k + "=" + (fused ? "true" : "false"));
      }
      Recipe recipe = llmRecipe(trainer, overrides);
      trainer.setup(recipe);
      auto comm = Communicator::loopback();
      ModelRuntime rt(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                      llmOptions(recipe, comm->layout(), true));
      losses.emplace_back();
      for (int step = 0; step < 5; ++step) losses.back().push_back(llmStep(rt, trainer, step, 4).loss);
    }
    for (size_t s = 0; s < losses[0].size(); ++s) {
      EXPECT_LT(test::relDiff(losses[1][s], losses[0][s]), 1e-6) << "step " << s << (hostKernels ? " host kernels" : "");
    }
  }
  nn::setHostKernels(false);
}

}  // namespace
}  // namespace ptrain

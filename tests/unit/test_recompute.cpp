// Activation recomputation (nn/recompute.h, model.recompute): the recomputed
// function gives the same values and gradients as the plain one, dropout
// included (the generators are replayed), and leaves the generator where the
// plain run leaves it; a GPT trained with full or selective recomputation
// has the same losses as without, on one rank and under tensor parallelism.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ptrain/engine/memory_settings.h"
#include "ptrain/nn/recompute.h"
#include "support/test_support.h"
#include "unit/llm_runtime_fixture.h"

namespace ptrain {
namespace {

using namespace llm_fixture;

TEST(Recompute, SameValuesGradientsAndRandomStreamAsThePlainFunction) {
  torch::Tensor w = torch::randn({6, 6}).requires_grad_(true);
  auto fn = [&](const std::vector<at::Tensor>& in) {
    return torch::dropout(torch::tanh(torch::matmul(in[0], w)), 0.3, true) * in[1];
  };
  at::Tensor x = torch::randn({4, 6}), s = torch::randn({4, 6});
  torch::manual_seed(42);
  at::Tensor xa = x.clone().requires_grad_(true), sa = s.clone().requires_grad_(true);
  at::Tensor plain = fn({xa, sa});
  plain.pow(2).sum().backward();
  const at::Tensor gw = w.grad().clone();
  const double nextPlain = torch::rand({1}).item<double>();
  w.mutable_grad().zero_();

  torch::manual_seed(42);
  at::Tensor xb = x.clone().requires_grad_(true), sb = s.clone().requires_grad_(true);
  at::Tensor again = nn::recomputed(fn, {xb, sb});
  // The generator moved on as the plain run moved it, before backward ...
  const double nextRecomputed = torch::rand({1}).item<double>();
  again.pow(2).sum().backward();
  EXPECT_TRUE(torch::equal(plain, again));
  EXPECT_TRUE(torch::equal(xa.grad(), xb.grad()));
  EXPECT_TRUE(torch::equal(sa.grad(), sb.grad()));
  EXPECT_TRUE(torch::equal(gw, w.grad()));
  EXPECT_EQ(nextPlain, nextRecomputed);
  // ... and backward's replay left it where it was.
  torch::manual_seed(42);
  fn({x, s});
  torch::rand({1});
  const double afterBoth = torch::rand({1}).item<double>();
  torch::manual_seed(42);
  at::Tensor y = nn::recomputed(fn, {x.clone().requires_grad_(true), s});
  torch::rand({1});
  y.sum().backward();
  EXPECT_EQ(torch::rand({1}).item<double>(), afterBoth);
}

// Counts the block runs it sees: added last, it sits inside the
// recomputation, so a recomputed block runs twice per micro-batch.
struct CountBlockRuns : StepHooks {
  at::Tensor runBlock(int index, const at::Tensor& input, const BlockRunner& next) override {
    ++runs;
    return next(input);
  }
  int runs = 0;
};

std::vector<double> gptLosses(const std::vector<std::string>& overrides, int steps, int* blockRuns = nullptr) {
  llm::LlmTrainer trainer{PluginContext{}};
  Recipe recipe = llmRecipe(trainer, overrides);
  trainer.setup(recipe);
  auto comm = Communicator::loopback();
  ModelRuntime rt(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                  llmOptions(recipe, comm->layout(), true));
  auto counter = std::make_shared<CountBlockRuns>();
  rt.addHooks(counter);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) losses.push_back(llmStep(rt, trainer, step, 4).loss);
  if (blockRuns != nullptr) *blockRuns = counter->runs;
  return losses;
}

TEST(Recompute, GptLossesEqualWithoutRecomputationDropoutIncluded) {
  const std::vector<std::string> base = {"model.dropout=0.1"};
  int plainRuns = 0, fullRuns = 0, firstRuns = 0;
  const std::vector<double> plain = gptLosses(base, 5, &plainRuns);
  // 4 blocks, 2 micro-batches, 5 steps; recomputed blocks run again in backward.
  EXPECT_EQ(plainRuns, 40);
  gptLosses({base[0], "model.recompute=full"}, 5, &fullRuns);
  EXPECT_EQ(fullRuns, 80);
  gptLosses({base[0], "model.recompute=full", "model.recompute_num_layers=1"}, 5, &firstRuns);
  EXPECT_EQ(firstRuns, 50);
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"model.recompute=full"},
        std::vector<std::string>{"model.recompute=full", "model.recompute_num_layers=1"},
        std::vector<std::string>{"model.recompute=selective"},
        std::vector<std::string>{"model.recompute=selective", "fusion.masked_softmax=true"}}) {
    std::vector<std::string> o = base;
    o.insert(o.end(), extra.begin(), extra.end());
    const std::vector<double> got = gptLosses(o, 5);
    const std::vector<double> reference =
        extra.size() > 1 && extra[1] == "fusion.masked_softmax=true" ? gptLosses({base[0], extra[1]}, 5) : plain;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i], reference[i]) << extra[0] << (extra.size() > 1 ? " " + extra[1] : "") << " step " << i;
    }
  }
}

// Under tensor and sequence parallelism (dropout masks drawn whole and
// sliced) and under a pipeline (a stream per stage): the same losses as the
// same layout without recomputation.
TEST(RecomputeRanks, TensorAndPipelineLayoutsRecomputeExactly) {
  for (auto [tp, pp] : {std::pair<int, int>{2, 1}, std::pair<int, int>{1, 2}}) {
    std::string failures = test::runRanks(2, [tp = tp, pp = pp](int rank, int size, int port) {
      std::vector<double> runs[2];
      auto comm = worldOf(rank, size, port, layoutOf(size, tp, pp));
      for (int r = 0; r < 2; ++r) {
        llm::LlmTrainer trainer{PluginContext{}};
        std::vector<std::string> o = layoutOverrides(tp, pp, tp > 1);
        o.push_back("model.dropout=0.1");
        o.push_back(r == 0 ? "model.recompute=none" : "model.recompute=full");
        Recipe recipe = llmRecipe(trainer, o);
        trainer.setup(recipe);
        ModelRuntime rt(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                        llmOptions(recipe, comm->layout(), true));
        for (int step = 0; step < 3; ++step) runs[r].push_back(llmStep(rt, trainer, step, 4).loss);
      }
      for (int step = 0; step < 3; ++step) EXPECT_EQ(runs[1][step], runs[0][step]) << "step " << step;
    });
    EXPECT_EQ(failures, "") << "tp " << tp << " pp " << pp;
  }
}

TEST(Recompute, CheckRefusesLayersBeyondAStageAndLayersWithoutFullRecompute) {
  llm::LlmTrainer trainer{PluginContext{}};
  Recipe tooMany = llmRecipe(trainer, {"model.recompute=full", "model.recompute_num_layers=3",
                                       "parallel.pipeline_model_parallel_size=2"});
  EXPECT_EQ(checkMemorySettings(tooMany),
            std::vector<std::string>{"<command line>: recompute_num_layers=3 exceeds the 2 blocks of a pipeline stage "
                                     "(num_layers / pipeline_model_parallel_size); use at most 2, or 0 for every block"});
  Recipe withoutFull = llmRecipe(trainer, {"model.recompute_num_layers=1"});
  EXPECT_EQ(checkMemorySettings(withoutFull),
            std::vector<std::string>{"<command line>: recompute_num_layers applies to model.recompute: full, and "
                                     "model.recompute is none; remove it or set model.recompute: full"});
  EXPECT_TRUE(checkMemorySettings(llmRecipe(trainer, {"model.recompute=full", "model.recompute_num_layers=4"})).empty());
}

}  // namespace
}  // namespace ptrain

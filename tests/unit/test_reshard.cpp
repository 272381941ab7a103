// Resharding in memory (engine/reshard.h), as GRPO moves its actor's weights
// to its rollout: on four forked ranks, an actor at tp 2 x dp 2 takes a
// training step, then its weights go to rollouts at tp 1 x dp 4 and tp 4.
// Each rollout's shards equal the slices of one rank's model after the same
// step (an independent run on a single rank), and generation on the rollouts
// (greedy, and sampled with the samples shared over their data-parallel
// ranks) gives that model's tokens.
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "llm_runtime_fixture.h"
#include "ptrain/engine/reshard.h"
#include "rollout.h"

namespace ptrain {
namespace {

using namespace llm_fixture;

std::map<std::string, at::Tensor> weightsOf(ModelRuntime& rt) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, p] : rt.model().localParameters()) out.emplace(name, p.detach().clone());
  return out;
}

std::vector<std::vector<int64_t>> greedy(ModelRuntime& rt, const std::vector<std::vector<int64_t>>& prompts) {
  auto& model = static_cast<llm::GptModel&>(rt.model());
  model.module().eval();
  grpo::RolloutOptions o;
  o.sampling.temperature = 0;
  o.max_response_length = 4;
  return grpo::generate(model, prompts, o).responses;
}

// Four samples per prompt at temperature 1, up to 5 tokens, stopping at EOS.
grpo::RolloutOptions sampling() {
  grpo::RolloutOptions o;
  o.n = 4;
  o.max_response_length = 5;
  o.stop_id = 1;
  o.seed = 17;
  return o;
}

TEST(Reshard, ActorWeightsReachRolloutsOfOtherTensorParallelSizes) {
  llm::LlmTrainer trainer{PluginContext{}};
  // SGD: an update proportional to the gradient. (Adam's first step moves a
  // weight by the learning rate whatever its gradient's size, so gradients
  // that are rounding noise would differ by 2 lr between layouts.)
  const Recipe recipe = llmRecipe(trainer, {"optimizer.name=sgd", "optimizer.lr=0.5"});
  trainer.setup(recipe);
  const std::vector<std::vector<int64_t>> prompts = {{2, 3, 12, 4}, {5, 13, 6, 15}};

  // The reference: one rank, the same step.
  auto single = Communicator::loopback();
  ModelRuntime reference(*single, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                         llmOptions(recipe, single->layout(), true));
  llmStep(reference, trainer, 0, 2);
  const auto full = weightsOf(reference);
  const auto tokens = greedy(reference, prompts);
  std::vector<std::vector<int64_t>> sampled;
  reference.inference([&](StagedModel& m, const EvalContext&) {
    sampled = grpo::generate(static_cast<llm::GptModel&>(m), prompts, sampling()).responses;
  });
  ASSERT_EQ(sampled.size(), 8u);

  const std::string failures = test::runRanks(4, [&](int rank, int size, int port) {
    auto comm = worldOf(rank, size, port, layoutOf(size, 2, 1));
    auto build = [&](const ModelBuild& b) { return trainer.buildModel(b); };
    ModelRuntime actor(*comm, registry(), build, llmOptions(recipe, comm->layout(), true));
    llmStep(actor, trainer, 0, 2);
    for (int tp : {1, 4}) {
      RuntimeOptions options = llmOptions(recipe, layoutOf(size, tp, 1), false);
      options.name = "rollout";
      // Built from another seed: only the resharding can make it equal.
      options.seed = 99;
      ModelRuntime rollout(*comm, registry(), build, options);
      reshardParameters(actor, rollout);
      for (auto& [name, p] : rollout.model().localParameters()) {
        const at::Tensor expected = rollout.model().placement.of(name).sliceOfFull(full.at(name), name);
        EXPECT_TRUE(torch::allclose(p, expected, 1e-5, 1e-6)) << "tp " << tp << " " << name;
      }
      EXPECT_EQ(greedy(rollout, prompts), tokens) << "tp " << tp;
      // Sampled, with the samples shared over the rollout's data-parallel
      // ranks (4 at tp 1, 1 at tp 4): one rank's tokens for the same seed.
      EXPECT_EQ(grpo::generateOnLayout(trainer, rollout, prompts, sampling()).responses, sampled) << "tp " << tp;
    }
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace ptrain

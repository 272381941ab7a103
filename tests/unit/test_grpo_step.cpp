// A GRPO iteration (trainers/llm_grpo/grpo_step.h) on four ranks, with the
// actor at tp 2 x dp 2, the rollout at tp 1 x dp 4 and the reference at
// tp 2 x dp 2, against the same two iterations on one rank: the same sampled
// responses and scores, the same losses and the same actor weights.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>

#include "grpo_step.h"
#include "llm_runtime_fixture.h"

namespace ptrain {
namespace {

using namespace llm_fixture;

grpo::GrpoOptions options() {
  grpo::GrpoOptions o;
  o.rollout.n = 4;
  o.rollout.max_response_length = 4;
  o.rollout.stop_id = 1;
  o.rollout.seed = 3;
  o.actor.micro_batch_size = 2;
  o.actor.kl_loss_coef = 0.1;
  o.ppo_mini_batch_size = 2;
  o.log_prob_micro_batch_size = 2;
  o.ref_log_prob_micro_batch_size = 2;
  return o;
}

// Scores that vary within a group: the share of the digit '3' (id 5) in the response.
double reward(int64_t, const std::vector<int64_t>& response) {
  return static_cast<double>(std::count(response.begin(), response.end(), 5)) /
         static_cast<double>(1 + response.size());
}

const std::vector<std::vector<int64_t>> kPrompts = {{2, 3, 12, 4, 15}, {5, 13, 6, 15}, {7, 14, 8, 15}, {9, 15}};

struct Iterations {
  std::vector<std::map<std::string, double>> metrics;
  std::vector<std::vector<std::vector<int64_t>>> responses;
};

Iterations iterate(const grpo::GptModels& trainer, ModelRuntime& actor, ModelRuntime& rollout,
                   ModelRuntime& reference) {
  Iterations run;
  for (int64_t step = 0; step < 2; ++step) {
    auto r = grpo::grpoStep(trainer, actor, rollout, &reference, kPrompts, reward, options(), step);
    run.metrics.push_back(r.metrics);
    run.responses.push_back(r.rollout.responses);
  }
  return run;
}

TEST(GrpoStep, ActorRolloutAndReferenceOnTheirOwnLayoutsMatchOneRank) {
  llm::LlmTrainer trainer{PluginContext{}};
  const Recipe recipe = llmRecipe(trainer, {"optimizer.name=sgd", "optimizer.lr=0.5", "optimizer.clip_grad=0",
                                            "model.dropout=0"});
  trainer.setup(recipe);
  auto build = [&](const ModelBuild& b) { return trainer.buildModel(b); };
  auto named = [&](const ParallelLayout& layout, const char* name, bool trained) {
    RuntimeOptions o = llmOptions(recipe, layout, trained);
    o.name = name;
    return o;
  };

  auto single = Communicator::loopback();
  ModelRuntime actor(*single, registry(), build, named(single->layout(), "actor", true));
  ModelRuntime rollout(*single, registry(), build, named(single->layout(), "rollout", false));
  ModelRuntime reference(*single, registry(), build, named(single->layout(), "ref", false));
  const Iterations expected = iterate(trainer, actor, rollout, reference);
  std::map<std::string, at::Tensor> weights;
  for (auto& [name, p] : actor.model().localParameters()) weights[name] = p.detach().clone();
  // The scores vary, so the policy loss moved the weights.
  EXPECT_GT(expected.metrics[0].at("critic/score/max"), expected.metrics[0].at("critic/score/min"));
  EXPECT_GT(expected.metrics[1].at("actor/kl_loss"), 0);

  const std::string failures = test::runRanks(4, [&](int rank, int size, int port) {
    auto comm = worldOf(rank, size, port, layoutOf(size, 2, 1));
    ModelRuntime a(*comm, registry(), build, named(layoutOf(size, 2, 1), "actor", true));
    ModelRuntime r(*comm, registry(), build, named(layoutOf(size, 1, 1), "rollout", false));
    ModelRuntime ref(*comm, registry(), build, named(layoutOf(size, 2, 1), "ref", false));
    const Iterations got = iterate(trainer, a, r, ref);
    for (size_t step = 0; step < 2; ++step) {
      EXPECT_EQ(got.responses[step], expected.responses[step]) << "step " << step;
      for (const char* key : {"critic/score/mean", "critic/advantages/mean", "actor/pg_loss", "actor/kl_loss",
                              "actor/ppo_kl", "actor/pg_clipfrac", "response_length/mean"}) {
        EXPECT_NEAR(got.metrics[step].at(key), expected.metrics[step].at(key), 1e-5) << key << " step " << step;
      }
    }
    for (auto& [name, p] : a.model().localParameters()) {
      const at::Tensor slice = a.model().placement.of(name).sliceOfFull(weights.at(name), name);
      EXPECT_TRUE(torch::allclose(p, slice, 1e-5, 1e-6)) << name;
    }
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace ptrain

// The actor's PPO update (trainers/llm_grpo/actor.h) against the same loss
// written out directly: the whole mini-batch's policy loss (aggregated by
// aggregateLoss) plus the KL and entropy terms, differentiated by autograd
// and applied as one plain SGD step. The actor takes the mini-batch in
// micro-batches of 1, 2 and 4 rows, under each aggregation mode, and must
// land on the same weights; its reported statistics are the direct ones.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "actor.h"
#include "llm_runtime_fixture.h"
#include "ppo_batch.h"

namespace ptrain {
namespace {

using namespace llm_fixture;

// Four rows of 8 tokens whose last 3-5 targets are the response, with old
// and reference log-probabilities near the model's own and per-row
// advantages of both signs.
Batch miniBatch(llm::GptModel& model) {
  torch::manual_seed(21);
  Batch b;
  const at::Tensor tokens = torch::randint(2, 16, {4, 8}, torch::kInt64);
  b.tensors["tokens"] = tokens;
  b.tensors["targets"] = torch::cat({tokens.narrow(1, 1, 7), torch::ones({4, 1}, torch::kInt64)}, 1);
  at::Tensor mask = torch::zeros({4, 8});
  const int64_t first[] = {3, 4, 5, 2};
  for (int64_t r = 0; r < 4; ++r) mask[r].narrow(0, first[r], 8 - first[r]).fill_(1);
  b.tensors["response_mask"] = mask;
  at::Tensor logp;
  {
    torch::NoGradGuard noGrad;
    logp = grpo::tokenLogProbs(model.logits(tokens).narrow(-1, 0, model.config().validVocab()), b.tensors["targets"]);
  }
  b.tensors["old_log_probs"] = logp + 0.3 * torch::randn({4, 8});
  b.tensors["ref_log_probs"] = logp + 0.2 * torch::randn({4, 8});
  b.tensors["advantages"] = torch::tensor({1.5f, -0.5f, -1.2f, 0.7f}).view({4, 1}).expand({4, 8}).contiguous();
  return b;
}

TEST(GrpoActor, UpdateEqualsTheDirectLossStepOverAnyMicroBatchSplit) {
  llm::LlmTrainer trainer{PluginContext{}};
  const Recipe recipe = llmRecipe(trainer, {"optimizer.name=sgd", "optimizer.lr=0.5", "optimizer.clip_grad=0",
                                            "optimizer.weight_decay=0", "model.dropout=0"});
  trainer.setup(recipe);
  auto comm = Communicator::loopback();
  auto build = [&](const ModelBuild& b) { return trainer.buildModel(b); };
  for (const char* mode : {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean"}) {
    grpo::ActorOptions o;
    o.policy.aggregation = grpo::lossAggregationFromName(mode);
    o.kl_loss_coef = 0.1;
    o.entropy_coeff = 0.01;

    // The direct reference.
    ModelRuntime direct(*comm, registry(), build, llmOptions(recipe, comm->layout(), false));
    auto& model = static_cast<llm::GptModel&>(direct.model());
    model.module().eval();  // no dropout in the test recipe either way
    const Batch b = miniBatch(model);
    const at::Tensor& mask = b.at("response_mask");
    // The valid vocabulary only, as the model's own log-probabilities take it.
    const at::Tensor logits = model.logits(b.at("tokens")).narrow(-1, 0, model.config().validVocab());
    const at::Tensor logp = grpo::tokenLogProbs(logits, b.at("targets"));
    const grpo::PolicyLoss pl = grpo::policyLoss(b.at("old_log_probs"), logp, b.at("advantages"), mask, o.policy);
    const at::Tensor kl = grpo::klPenalty(logp, b.at("ref_log_probs"), o.kl_loss_type);
    const at::Tensor entropy = grpo::entropyFromLogits(logits);
    const at::Tensor loss = pl.pg_loss + o.kl_loss_coef * grpo::aggregateLoss(kl, mask, o.policy.aggregation) -
                            o.entropy_coeff * grpo::aggregateLoss(entropy, mask, o.policy.aggregation);
    loss.backward();
    std::map<std::string, at::Tensor> expected;
    for (auto& [name, p] : direct.model().localParameters()) expected[name] = (p - 0.5 * p.grad()).detach();

    for (int64_t micro : {1, 2, 4}) {
      o.micro_batch_size = micro;
      ModelRuntime actor(*comm, registry(), build, llmOptions(recipe, comm->layout(), true));
      const grpo::ActorStats stats = grpo::updateActor(trainer, actor, b, o, 0);
      EXPECT_TRUE(stats.applied);
      for (auto& [name, p] : actor.model().localParameters()) {
        EXPECT_TRUE(torch::allclose(p, expected.at(name), 1e-5, 1e-6)) << mode << " micro " << micro << " " << name;
      }
      EXPECT_NEAR(stats.pg_loss, pl.pg_loss.item<double>(), 1e-5) << mode;
      EXPECT_NEAR(stats.kl_loss, grpo::aggregateLoss(kl, mask, o.policy.aggregation).item<double>(), 1e-5) << mode;
      EXPECT_NEAR(stats.pg_clipfrac, pl.pg_clipfrac.item<double>(), 1e-6) << mode;
      EXPECT_NEAR(stats.ppo_kl, pl.ppo_kl.item<double>(), 1e-5) << mode;
      EXPECT_NEAR(stats.entropy, grpo::maskedMean(entropy, mask).item<double>(), 1e-5) << mode;
    }
  }
}

TEST(GrpoPpoBatch, SequencesTargetsMaskAndAdvantagesByHand) {
  grpo::Rollout r;
  r.prompts = {{5, 6, 7}, {8, 9}};
  r.responses = {{10, 1}, {}};
  const Batch b = grpo::ppoBatch(r, torch::tensor({0.5f, -1.f}), 0);
  EXPECT_TRUE(torch::equal(b.at("tokens"), torch::tensor({{5L, 6L, 7L, 10L}, {8L, 9L, 0L, 0L}})));
  EXPECT_TRUE(torch::equal(b.at("targets"), torch::tensor({{6L, 7L, 10L, 1L}, {9L, 0L, 0L, 0L}})));
  EXPECT_TRUE(torch::equal(b.at("response_mask"), torch::tensor({{0.f, 0.f, 1.f, 1.f}, {0.f, 0.f, 0.f, 0.f}})));
  EXPECT_TRUE(torch::equal(b.at("advantages"), torch::tensor({{0.f, 0.f, 0.5f, 0.5f}, {0.f, 0.f, 0.f, 0.f}})));
}

TEST(GrpoPpoBatch, TargetLogProbsOnAnyLayoutEqualOneRanksLogSoftmax) {
  llm::LlmTrainer trainer{PluginContext{}};
  const Recipe recipe = llmRecipe(trainer, {"model.dropout=0"});
  trainer.setup(recipe);
  auto build = [&](const ModelBuild& b) { return trainer.buildModel(b); };
  auto single = Communicator::loopback();
  ModelRuntime one(*single, registry(), build, llmOptions(recipe, single->layout(), false));
  auto& model = static_cast<llm::GptModel&>(one.model());
  torch::manual_seed(8);
  Batch b;
  b.tensors["tokens"] = torch::randint(2, 16, {8, 8}, torch::kInt64);
  b.tensors["targets"] = torch::randint(2, 16, {8, 8}, torch::kInt64);
  at::Tensor expected;
  {
    torch::NoGradGuard noGrad;
    model.module().eval();
    expected = grpo::tokenLogProbs(model.logits(b.at("tokens")).narrow(-1, 0, model.config().validVocab()),
                                   b.at("targets"));
  }
  EXPECT_TRUE(torch::allclose(grpo::targetLogProbs(trainer, one, b, 4), expected, 1e-5, 1e-6));
  const std::string failures = test::runRanks(4, [&](int rank, int size, int port) {
    auto comm = worldOf(rank, size, port, layoutOf(size, 2, 1));
    ModelRuntime rt(*comm, registry(), build, llmOptions(recipe, comm->layout(), false));
    // tp 2 x dp 2: each data-parallel rank takes 4 rows in micro-batches of 2.
    EXPECT_TRUE(torch::allclose(grpo::targetLogProbs(trainer, rt, b, 2), expected, 1e-5, 1e-6)) << "rank " << rank;
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace ptrain

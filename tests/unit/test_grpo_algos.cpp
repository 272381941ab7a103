// GRPO's parts (trainers/llm_grpo) against values worked by hand or an
// independent path: group advantages with and without the standard
// deviation; the clipped surrogate with dual clip under each aggregation mode
// (value, clip fractions, approximate KL, gradient) and the aggregation as
// weights that any split of the batch sums alike; the KL estimators; entropy;
// sampling (temperature, top-k, top-p, seeded draws); the rollout over the KV
// cache against greedy decoding without one; the arithmetic reward; the
// model's token log-probabilities against the log-softmax of its logits.
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

#include "core_algos.h"
#include "ptrain/datasets/arithmetic.h"
#include "reward.h"
#include "rollout.h"
#include "sampling.h"
#include "ptrain/core/error.h"

namespace ptrain::grpo {
namespace {

double item(const at::Tensor& t) { return t.item<double>(); }

TEST(GrpoAdvantages, GroupMeanOverUnbiasedStdAndDrGrpo) {
  const at::Tensor scores = torch::tensor({1.f, 0.f, 0.f, 1.f, 1.f, 1.f, 1.f, 1.f});
  // Group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735; group 2: all equal.
  const double a = 0.5 / (std::sqrt(1.0 / 3.0) + 1e-6);
  const at::Tensor grpo = groupAdvantages(scores, 4, true);
  const std::vector<double> expected = {a, -a, -a, a, 0, 0, 0, 0};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(grpo[i].item<double>(), expected[static_cast<size_t>(i)], 1e-6) << i;
  const at::Tensor dr = groupAdvantages(scores, 4, false);
  const std::vector<double> centred = {0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(dr[i].item<double>(), centred[static_cast<size_t>(i)], 1e-7) << i;
  // A group of one: mean 0, std 1.
  const at::Tensor single = groupAdvantages(torch::tensor({3.f, -1.f}), 1, true);
  EXPECT_NEAR(single[0].item<double>(), 3 / (1 + 1e-6), 1e-6);
  EXPECT_NEAR(single[1].item<double>(), -1 / (1 + 1e-6), 1e-6);
  EXPECT_THROW(groupAdvantages(scores, 3, true), InternalError);
}

// Row 0: ratios 1.5, 0.5, 1.1 (and a masked token); advantages 1, 1, -1.
// Row 1: ratio 5 with advantage -1 (the dual clip), the rest masked.
struct Case {
  at::Tensor old_logp = torch::zeros({2, 4});
  at::Tensor logp;
  at::Tensor adv = torch::tensor({{1.f, 1.f, -1.f, 1.f}, {-1.f, -1.f, -1.f, -1.f}});
  at::Tensor mask = torch::tensor({{1.f, 1.f, 1.f, 0.f}, {1.f, 0.f, 0.f, 0.f}});
  Case() {
    logp = torch::tensor({{std::log(1.5f), std::log(0.5f), std::log(1.1f), 5.f}, {std::log(5.f), 0.f, 0.f, 0.f}})
               .requires_grad_(true);
  }
};

TEST(GrpoPolicyLoss, ClippedSurrogateWithDualClipByHand) {
  Case c;
  PolicyLossOptions o;  // clip 0.2 / 0.2, c = 3, token-mean
  const PolicyLoss l = policyLoss(c.old_logp, c.logp, c.adv, c.mask, o);
  // Per token: -1.2 (clipped at 1.2), -0.5, 1.1, and 3 (5 bounded by -A c).
  EXPECT_NEAR(item(l.pg_loss), (-1.2 - 0.5 + 1.1 + 3) / 4, 1e-6);
  EXPECT_NEAR(item(l.pg_clipfrac), 0.25, 1e-7);
  EXPECT_NEAR(item(l.pg_clipfrac_lower), 0.25, 1e-7);
  EXPECT_NEAR(item(l.ppo_kl), -(std::log(1.5) + std::log(0.5) + std::log(1.1) + std::log(5.0)) / 4, 1e-6);
  // Only the unclipped tokens carry gradient: d(-A r)/d logp = -A r, over 4 tokens.
  l.pg_loss.backward();
  const at::Tensor g = c.logp.grad();
  EXPECT_NEAR(g[0][0].item<double>(), 0, 1e-7);
  EXPECT_NEAR(g[0][1].item<double>(), -0.5 / 4, 1e-6);
  EXPECT_NEAR(g[0][2].item<double>(), 1.1 / 4, 1e-6);
  EXPECT_NEAR(g[0][3].item<double>(), 0, 1e-7);
  EXPECT_NEAR(g[1][0].item<double>(), 0, 1e-7);
}

TEST(GrpoPolicyLoss, AggregationModes) {
  Case c;
  PolicyLossOptions o;
  o.aggregation = lossAggregationFromName("seq-mean-token-sum");
  // Row sums -0.6 and 3.
  EXPECT_NEAR(item(policyLoss(c.old_logp, c.logp, c.adv, c.mask, o).pg_loss), (-0.6 + 3) / 2, 1e-6);
  o.aggregation = lossAggregationFromName("seq-mean-token-mean");
  // Row means -0.2 and 3.
  EXPECT_NEAR(item(policyLoss(c.old_logp, c.logp, c.adv, c.mask, o).pg_loss), (-0.2 + 3) / 2, 1e-6);
  EXPECT_STREQ(toString(o.aggregation), "seq-mean-token-mean");
  EXPECT_THROW(lossAggregationFromName("token-sum"), ConfigError);
  // Asymmetric clipping (DAPO's clip-higher): ratio 1.5 clipped at 1.3.
  o.aggregation = LossAggregation::kTokenMean;
  o.clip_ratio_high = 0.3;
  EXPECT_NEAR(item(policyLoss(c.old_logp, c.logp, c.adv, c.mask, o).pg_loss), (-1.3 - 0.5 + 1.1 + 3) / 4, 1e-6);
}

TEST(GrpoPolicyLoss, AggregationAsWeightsSumsToTheSameOverAnySplit) {
  torch::manual_seed(4);
  const at::Tensor loss = torch::randn({6, 5});
  const at::Tensor mask = torch::tensor({{1.f, 1.f, 1.f, 0.f, 0.f},
                                         {1.f, 1.f, 1.f, 1.f, 1.f},
                                         {1.f, 0.f, 0.f, 0.f, 0.f},
                                         {1.f, 1.f, 0.f, 0.f, 0.f},
                                         {1.f, 1.f, 1.f, 1.f, 0.f},
                                         {1.f, 1.f, 1.f, 0.f, 0.f}});
  for (auto mode : {LossAggregation::kTokenMean, LossAggregation::kSeqMeanTokenSum, LossAggregation::kSeqMeanTokenMean}) {
    const AggregationWeights w = aggregationWeights(mask, mode);
    const double whole = item(aggregateLoss(loss, mask, mode));
    EXPECT_NEAR(item((w.weights * loss).sum()) / w.divisor, whole, 1e-6) << toString(mode);
    // Rows 0-1 on one micro-batch (or rank), 2-5 on another.
    const double split = (item((w.weights.narrow(0, 0, 2) * loss.narrow(0, 0, 2)).sum()) +
                          item((w.weights.narrow(0, 2, 4) * loss.narrow(0, 2, 4)).sum())) /
                         w.divisor;
    EXPECT_NEAR(split, whole, 1e-6) << toString(mode);
  }
  EXPECT_DOUBLE_EQ(aggregationWeights(mask, LossAggregation::kTokenMean).divisor, 18.0);
  EXPECT_DOUBLE_EQ(aggregationWeights(mask, LossAggregation::kSeqMeanTokenMean).divisor, 6.0);
}

TEST(GrpoKl, EstimatorsByHand) {
  const at::Tensor logp = torch::tensor({std::log(0.5f), 0.f});
  const at::Tensor ref = torch::tensor({std::log(0.25f), 30.f});
  const double d = std::log(2.0);  // logp - ref for the first token
  EXPECT_NEAR(klPenalty(logp, ref, klEstimatorFromName("kl"))[0].item<double>(), d, 1e-6);
  EXPECT_NEAR(klPenalty(logp, ref, klEstimatorFromName("k1"))[0].item<double>(), d, 1e-6);
  EXPECT_NEAR(klPenalty(logp, ref, klEstimatorFromName("abs"))[0].item<double>(), d, 1e-6);
  EXPECT_NEAR(klPenalty(logp, ref, klEstimatorFromName("mse"))[0].item<double>(), 0.5 * d * d, 1e-6);
  // k3: r - log r - 1 with r = 0.25 / 0.5.
  const at::Tensor k3 = klPenalty(logp, ref, klEstimatorFromName("low_var_kl"));
  EXPECT_NEAR(k3[0].item<double>(), 0.5 + d - 1, 1e-6);
  // exp(20) - 20 - 1, clamped to 10.
  EXPECT_DOUBLE_EQ(k3[1].item<double>(), 10.0);
  EXPECT_THROW(klEstimatorFromName("k4"), ConfigError);
}

TEST(GrpoEntropy, CategoricalEntropyAndTokenLogProbs) {
  const at::Tensor logits = torch::tensor({{0.f, 0.f}, {0.f, std::log(3.f)}});
  const at::Tensor h = entropyFromLogits(logits);
  EXPECT_NEAR(h[0].item<double>(), std::log(2.0), 1e-6);
  EXPECT_NEAR(h[1].item<double>(), -(0.25 * std::log(0.25) + 0.75 * std::log(0.75)), 1e-6);
  const at::Tensor lp = tokenLogProbs(logits, torch::tensor({0L, 1L}));
  EXPECT_NEAR(lp[0].item<double>(), std::log(0.5), 1e-6);
  EXPECT_NEAR(lp[1].item<double>(), std::log(0.75), 1e-6);
  // Masked tokens do not count, and an all-padding batch gives 0, not NaN.
  EXPECT_NEAR(item(maskedMean(torch::tensor({1.f, 5.f}), torch::tensor({1.f, 0.f}))), 1.0, 1e-7);
  EXPECT_EQ(item(maskedMean(torch::tensor({1.f, 5.f}), torch::zeros({2}))), 0.0);
}

// Probabilities 0.1, 0.2, 0.3, 0.4.
at::Tensor fourLogits() { return torch::tensor({{0.f, std::log(2.f), std::log(3.f), std::log(4.f)}}); }

void expectProbs(const at::Tensor& p, std::vector<double> expected) {
  ASSERT_EQ(p.size(1), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(p[0][static_cast<int64_t>(i)].item<double>(), expected[i], 1e-6) << i;
}

TEST(GrpoSampling, TemperatureTopKAndTopPByHand) {
  SamplingOptions o;
  expectProbs(samplingProbs(fourLogits(), o), {0.1, 0.2, 0.3, 0.4});
  o.top_k = 2;
  expectProbs(samplingProbs(fourLogits(), o), {0, 0, 3.0 / 7, 4.0 / 7});
  o.top_k = -1;
  o.top_p = 0.5;  // 0.4, then 0.3 crosses 0.5: both kept
  expectProbs(samplingProbs(fourLogits(), o), {0, 0, 3.0 / 7, 4.0 / 7});
  o.top_p = 0.35;  // 0.4 alone reaches it
  expectProbs(samplingProbs(fourLogits(), o), {0, 0, 0, 1});
  o.top_p = 1;
  o.temperature = 0.5;  // p^2, renormalised
  expectProbs(samplingProbs(fourLogits(), o), {1.0 / 30, 4.0 / 30, 9.0 / 30, 16.0 / 30});
  o.temperature = 0;  // greedy
  expectProbs(samplingProbs(fourLogits(), o), {0, 0, 0, 1});
}

std::vector<at::Generator> generators(int64_t rows, uint64_t seed) {
  std::vector<at::Generator> out;
  for (int64_t r = 0; r < rows; ++r) out.push_back(rowGenerator(seed, r));
  return out;
}

TEST(GrpoSampling, DrawsFollowTheDistributionAndDependOnTheRowsOwnStream) {
  SamplingOptions o;
  const at::Tensor logits = fourLogits().expand({20000, 4}).contiguous();
  auto first = generators(20000, 7), second = generators(20000, 7);
  const at::Tensor a = sampleTokens(logits, o, first);
  EXPECT_TRUE(torch::equal(a, sampleTokens(logits, o, second)));
  for (int64_t token = 0; token < 4; ++token) {
    EXPECT_NEAR(a.eq(token).to(torch::kFloat64).mean().item<double>(), 0.1 * static_cast<double>(token + 1), 0.01)
        << token;
  }
  // Row 5 alone, with its own stream, draws what it drew among 20000 rows.
  std::vector<at::Generator> alone = {rowGenerator(7, 5)};
  EXPECT_EQ(sampleTokens(fourLogits(), o, alone)[0].item<int64_t>(), a[5].item<int64_t>());
  // A token of probability 0 is never drawn.
  o.top_k = 2;
  const at::Tensor filtered = sampleTokens(logits, o, first);
  EXPECT_TRUE(filtered.ge(2).all().item<bool>());
  o.top_k = 1;
  EXPECT_TRUE(sampleTokens(logits, o, first).eq(3).all().item<bool>());
}

llm::GptConfig rolloutConfig() {
  llm::GptConfig c;
  c.vocab_size = 16;
  c.seq_length = 14;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_heads = 4;
  return c;
}

TEST(GrpoRollout, GreedyRolloutWithTheCacheEqualsGreedyDecodingWithout) {
  torch::manual_seed(5);
  llm::GptModel model(rolloutConfig());
  model.module().eval();
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {4, 5, 6, 7, 8}, {9}};
  RolloutOptions o;
  o.sampling.temperature = 0;
  o.n = 2;
  o.max_response_length = 8;
  o.stop_id = 3;
  const Rollout r = generate(model, prompts, o);
  // The model's own greedy decoding recomputes every prefix (no cache).
  const auto reference = model.greedyDecode(prompts, o.max_response_length, o.stop_id);
  ASSERT_EQ(r.responses.size(), 6u);
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_EQ(r.prompts[p * 2 + s], prompts[p]);
      EXPECT_EQ(r.responses[p * 2 + s], reference[p]) << "prompt " << p << " sample " << s;
    }
  }
  // Prompt 1 (5 tokens) can grow to seq_length (14): at most 9 new tokens, 8 asked.
  for (const auto& response : r.responses) EXPECT_LE(response.size(), 8u);
}

TEST(GrpoRollout, SamplesDifferAcrossTheGroupAndDependOnTheirRowAlone) {
  torch::manual_seed(5);
  llm::GptModel model(rolloutConfig());
  model.module().eval();
  RolloutOptions o;
  o.n = 4;
  o.max_response_length = 6;
  o.sampling.temperature = 1.5;
  o.seed = 11;
  const Rollout first = generate(model, {{1, 2}, {3, 4, 5}}, o);
  EXPECT_EQ(generate(model, {{1, 2}, {3, 4, 5}}, o).responses, first.responses);
  // Four samples of one prompt at temperature 1.5 over 16 tokens: not all equal.
  EXPECT_FALSE(first.responses[0] == first.responses[1] && first.responses[1] == first.responses[2] &&
               first.responses[2] == first.responses[3]);
  for (const auto& response : first.responses) {
    EXPECT_EQ(response.size(), 6u);  // no stop token
    for (int64_t t : response) EXPECT_LT(t, 16);
  }
  // A prompt of 12 tokens at seq_length 14 leaves room for 3 new ones: the
  // model reads 14 positions and the last token is only a target.
  for (const auto& response : generate(model, {std::vector<int64_t>(12, 2)}, o).responses) {
    EXPECT_EQ(response.size(), 3u);
  }
  // The second prompt's samples generated on their own (as another
  // data-parallel rank would, from row 4 on) are the same.
  const Rollout second = generate(model, {{3, 4, 5}}, o, 4);
  for (size_t s = 0; s < 4; ++s) EXPECT_EQ(second.responses[s], first.responses[4 + s]) << s;
}

TEST(GrpoReward, ExactAnswerFormatAndMalformed) {
  using Tok = datasets::ArithmeticTokenizer;
  auto tokens = [](const std::string& text, bool eos) {
    std::vector<int64_t> t = Tok::encode(text);
    if (eos) t.push_back(Tok::kEos);
    return t;
  };
  RewardOptions o;
  o.format = 0.1;
  EXPECT_EQ(arithmeticReward(tokens("432", true), "432", o), 1.0);
  EXPECT_EQ(arithmeticReward(tokens("-17", true), "-17", o), 1.0);
  EXPECT_EQ(arithmeticReward(tokens("431", true), "432", o), 0.1);   // a number, the wrong one
  EXPECT_EQ(arithmeticReward(tokens("432", false), "432", o), 0.0);  // never ended
  EXPECT_EQ(arithmeticReward(tokens("4+32", true), "432", o), 0.0);  // not a number
  EXPECT_EQ(arithmeticReward(tokens("4-3", true), "432", o), 0.0);
  EXPECT_EQ(arithmeticReward(tokens("", true), "432", o), 0.0);
  EXPECT_EQ(arithmeticReward(tokens("-", true), "432", o), 0.0);
  // What follows EOS does not count.
  std::vector<int64_t> trailing = tokens("432", true);
  trailing.push_back(Tok::kPlus);
  EXPECT_EQ(arithmeticReward(trailing, "432"), 1.0);
  // Without a format reward a wrong number earns nothing.
  EXPECT_EQ(arithmeticReward(tokens("431", true), "432"), 0.0);
}

TEST(GrpoRollout, TokenLogProbsAreTheLogSoftmaxOfTheLogits) {
  torch::manual_seed(6);
  llm::GptModel model(rolloutConfig());
  model.module().eval();
  const at::Tensor tokens = torch::randint(0, 16, {2, 7}, torch::kInt64);
  const at::Tensor targets = torch::randint(0, 16, {2, 7}, torch::kInt64);
  Batch b;
  b.tensors.emplace("tokens", tokens);
  at::Tensor hidden = model.embed(b);
  for (int i = 0; i < model.numBlocks(); ++i) hidden = model.runBlock(i, hidden);
  const at::Tensor logp = model.tokenLogProbs(hidden, targets);
  const at::Tensor reference = tokenLogProbs(model.logits(tokens), targets);
  EXPECT_TRUE(torch::allclose(logp, reference, 1e-5, 1e-6));
  EXPECT_TRUE(logp.requires_grad());
}

}  // namespace
}  // namespace ptrain::grpo

#include "checks.h"

namespace ptrain::grpo {
namespace {

TEST(GrpoChecks, VerlsKnownFailuresOneLineEachWithTheFix) {
  GrpoLayoutRequest ok;
  ok.world = 4;
  ok.train_batch_size = 8;
  ok.rollout_n = 4;
  ok.actor_tp = 2;
  ok.rollout_tp = 1;
  ok.ppo_mini_batch_size = 4;
  ok.ppo_micro_batch_size_per_gpu = 2;
  ok.num_attention_heads = 4;
  ok.padded_vocab = 128;
  EXPECT_TRUE(checkGrpoLayout(ok).empty());

  auto only = [](const GrpoLayoutRequest& q) {
    const auto problems = checkGrpoLayout(q);
    EXPECT_EQ(problems.size(), 1u);
    return problems.empty() ? std::string() : problems.front();
  };
  GrpoLayoutRequest q = ok;
  q.rollout_tp = 3;
  q.num_attention_heads = 0;
  q.padded_vocab = 0;
  EXPECT_EQ(only(q), "actor_rollout_ref.rollout.tensor_model_parallel_size=3 does not divide the world size 4: "
                     "use 1, 2, 4");
  q = ok;
  q.rollout_tp = 4;
  q.train_batch_size = 3;
  q.ppo_mini_batch_size = 3;
  q.rollout_n = 1;
  // 3 samples over the actor's dp 2 x micro 2.
  EXPECT_EQ(only(q), "data.train_batch_size * rollout.n = 3 samples do not split into the actor's 2 data-parallel "
                     "ranks x actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2: use data.train_batch_size 4");
  q = ok;
  q.actor_tp = 4;
  q.ppo_micro_batch_size_per_gpu = 1;
  q.train_batch_size = 3;
  q.ppo_mini_batch_size = 3;
  q.rollout_n = 2;
  // 6 samples over the rollout's 4 data-parallel ranks.
  EXPECT_EQ(only(q), "data.train_batch_size * rollout.n = 6 samples do not split into the rollout's 4 data-parallel "
                     "ranks (world 4 / actor_rollout_ref.rollout.tensor_model_parallel_size 1): use "
                     "data.train_batch_size 2 or 4");
  q = ok;
  q.ppo_mini_batch_size = 3;
  EXPECT_EQ(only(q), "actor_rollout_ref.actor.ppo_mini_batch_size=3 does not divide data.train_batch_size=8: "
                     "use 1, 2, 4, 8");
  q = ok;
  q.ppo_mini_batch_size = 16;
  EXPECT_EQ(only(q), "actor_rollout_ref.actor.ppo_mini_batch_size=16 is above data.train_batch_size=8: a mini-batch "
                     "is part of a step's prompts; use at most 8");
  q = ok;
  q.ppo_mini_batch_size = 1;
  q.rollout_n = 2;
  q.ppo_micro_batch_size_per_gpu = 2;
  // 2 samples per mini-batch over dp 2 x micro 2.
  EXPECT_EQ(only(q), "actor_rollout_ref.actor.ppo_mini_batch_size=1 (x rollout.n = 2 samples) does not split into "
                     "2 data-parallel ranks x ppo_micro_batch_size_per_gpu=2: make ppo_mini_batch_size * rollout.n "
                     "a multiple of 4");
  q = ok;
  q.num_attention_heads = 6;
  q.actor_tp = 1;
  q.rollout_tp = 4;
  q.ppo_micro_batch_size_per_gpu = 1;
  EXPECT_EQ(only(q), "actor_rollout_ref.rollout.tensor_model_parallel_size=4 does not divide "
                     "model.num_attention_heads=6: use 1, 2, 3, 6");
  q = ok;
  q.padded_vocab = 6;
  q.rollout_tp = 4;
  q.num_attention_heads = 4;
  EXPECT_EQ(only(q), "actor_rollout_ref.rollout.tensor_model_parallel_size=4 does not divide the padded vocabulary "
                     "of 6 rows: use a model.make_vocab_size_divisible_by that it divides");
}

}  // namespace
}  // namespace ptrain::grpo

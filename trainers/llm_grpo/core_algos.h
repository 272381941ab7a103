// GRPO's algorithm, as verl's core_algos computes it: group-relative
// advantages, the clipped policy-gradient loss (with dual clip), the KL
// estimators against a reference policy, entropy, and the loss aggregation
// modes. Pure tensor functions: no model, no communication. The trainer
// (issue 16's llm_grpo) calls them on each PPO micro-batch.
//
// Shapes: per-token tensors are [batch, response_length] and come with a
// response mask of the same shape (1 for response tokens, 0 for padding);
// sequence scores are [batch].
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

namespace ptrain::grpo {

// algorithm.norm_adv_by_std_in_grpo: true gives GRPO (score minus the group's
// mean, over the group's standard deviation + epsilon, the unbiased standard
// deviation as torch.std); false gives Dr. GRPO (the mean subtracted only).
// `scores` [batch] in groups of `groupSize` consecutive rows (the samples of
// one prompt); a group of one gets mean 0 and std 1. Returns [batch].
at::Tensor groupAdvantages(const at::Tensor& scores, int64_t groupSize, bool normByStd, double epsilon = 1e-6);

// actor.loss_agg_mode.
enum class LossAggregation {
  kTokenMean,          // "token-mean": every response token of the batch weighs the same
  kSeqMeanTokenSum,    // "seq-mean-token-sum": each sequence's token sum, averaged over sequences
  kSeqMeanTokenMean,   // "seq-mean-token-mean": each sequence's token mean, averaged over sequences
};
// Throws ConfigError naming the accepted values for anything else.
LossAggregation lossAggregationFromName(const std::string& name);
const char* toString(LossAggregation mode);

// Reduces a per-token loss [batch, length] under `mask` to a scalar.
at::Tensor aggregateLoss(const at::Tensor& loss, const at::Tensor& mask, LossAggregation mode);

// The same aggregation as per-token weights and one divisor:
// sum(weights * loss) / divisor equals aggregateLoss(loss, mask, mode) for
// the rows given, and any split of those rows (micro-batches, data-parallel
// ranks) sums to it, since the divisor is counted on them all (token-mean:
// the mask's sum; the seq-mean modes: the number of rows, with weights 1 or
// 1 / the row's tokens). Give it the whole mini-batch's mask.
struct AggregationWeights {
  at::Tensor weights;  // [batch, length]
  double divisor = 1;
};
AggregationWeights aggregationWeights(const at::Tensor& mask, LossAggregation mode);

// The mean of `values` over the tokens `mask` keeps.
at::Tensor maskedMean(const at::Tensor& values, const at::Tensor& mask);

struct PolicyLossOptions {
  double clip_ratio_low = 0.2;    // actor.clip_ratio_low
  double clip_ratio_high = 0.2;   // actor.clip_ratio_high
  double clip_ratio_c = 3.0;      // actor.clip_ratio_c: the dual clip's bound for negative advantages (> 1)
  LossAggregation aggregation = LossAggregation::kTokenMean;
};

struct PolicyLoss {
  at::Tensor per_token;          // [batch, length] before aggregation, differentiable
  at::Tensor pg_loss;            // scalar, differentiable in log_prob
  at::Tensor pg_clipfrac;        // share of tokens where the clipped term was taken
  at::Tensor ppo_kl;             // mean of old - new log-probability
  at::Tensor pg_clipfrac_lower;  // share of tokens the dual clip bounded
};

// The PPO clipped surrogate with dual clip (Ye et al., 2020), per token:
// ratio = exp(clamp(logp - old_logp, -20, 20)); loss = max(-A ratio,
// -A clamp(ratio, 1 - low, 1 + high)), and for A < 0 at most -A c.
PolicyLoss policyLoss(const at::Tensor& oldLogProb, const at::Tensor& logProb, const at::Tensor& advantages,
                      const at::Tensor& mask, const PolicyLossOptions& options);

// actor.kl_loss_type: per-token estimates of KL(policy || reference) from the
// two log-probabilities.
enum class KlEstimator {
  kKl,        // "kl" (k1): logp - ref
  kAbs,       // "abs": |logp - ref|
  kMse,       // "mse" (k2): (logp - ref)^2 / 2
  kLowVarKl,  // "low_var_kl" (k3, Schulman): exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10]
};
KlEstimator klEstimatorFromName(const std::string& name);
const char* toString(KlEstimator estimator);

// Per-token KL estimate [batch, length].
at::Tensor klPenalty(const at::Tensor& logProb, const at::Tensor& refLogProb, KlEstimator estimator);

// The entropy of the categorical distribution of each row of `logits`
// [..., vocab]: logsumexp(z) - sum softmax(z) z. Returns [...].
at::Tensor entropyFromLogits(const at::Tensor& logits);

// The log-probability of `tokens` [...] under `logits` [..., vocab], in
// float32 whatever the logits' dtype.
at::Tensor tokenLogProbs(const at::Tensor& logits, const at::Tensor& tokens);

}  // namespace ptrain::grpo

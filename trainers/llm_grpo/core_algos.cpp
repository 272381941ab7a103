#include "core_algos.h"

#include <torch/torch.h>

#include "ptrain/core/error.h"

namespace ptrain::grpo {

at::Tensor groupAdvantages(const at::Tensor& scores, int64_t groupSize, bool normByStd, double epsilon) {
  PTRAIN_CHECK(scores.dim() == 1, "groupAdvantages: scores must be [batch], got ", scores.sizes());
  PTRAIN_CHECK(groupSize >= 1 && scores.size(0) % groupSize == 0, "groupAdvantages: ", scores.size(0),
               " scores do not split into groups of ", groupSize);
  const at::Tensor grouped = scores.to(torch::kFloat32).view({-1, groupSize});
  at::Tensor mean, std;
  if (groupSize == 1) {
    mean = torch::zeros_like(grouped);
    std = torch::ones_like(grouped);
  } else {
    mean = grouped.mean(1, /*keepdim=*/true);
    std = grouped.std(1, /*unbiased=*/true, /*keepdim=*/true);
  }
  at::Tensor advantages = grouped - mean;
  if (normByStd) advantages = advantages / (std + epsilon);
  return advantages.reshape({-1});
}

LossAggregation lossAggregationFromName(const std::string& name) {
  if (name == "token-mean") return LossAggregation::kTokenMean;
  if (name == "seq-mean-token-sum") return LossAggregation::kSeqMeanTokenSum;
  if (name == "seq-mean-token-mean") return LossAggregation::kSeqMeanTokenMean;
  throw ConfigError("loss_agg_mode: '" + name + "' is not one of token-mean, seq-mean-token-sum, seq-mean-token-mean");
}

const char* toString(LossAggregation mode) {
  switch (mode) {
    case LossAggregation::kTokenMean: return "token-mean";
    case LossAggregation::kSeqMeanTokenSum: return "seq-mean-token-sum";
    case LossAggregation::kSeqMeanTokenMean: return "seq-mean-token-mean";
  }
  return "?";
}

at::Tensor maskedMean(const at::Tensor& values, const at::Tensor& mask) {
  const at::Tensor m = mask.to(values.scalar_type());
  // An empty mask gives 0 rather than NaN (a batch whose responses are all
  // padding contributes nothing).
  return (values * m).sum() / m.sum().clamp_min(1);
}

at::Tensor aggregateLoss(const at::Tensor& loss, const at::Tensor& mask, LossAggregation mode) {
  PTRAIN_CHECK(loss.dim() == 2 && loss.sizes() == mask.sizes(), "aggregateLoss: loss ", loss.sizes(), " and mask ",
               mask.sizes(), " must both be [batch, length]");
  const at::Tensor m = mask.to(loss.scalar_type());
  switch (mode) {
    case LossAggregation::kTokenMean:
      return maskedMean(loss, mask);
    case LossAggregation::kSeqMeanTokenSum:
      return (loss * m).sum(1).mean();
    case LossAggregation::kSeqMeanTokenMean:
      return ((loss * m).sum(1) / m.sum(1).clamp_min(1)).mean();
  }
  throw InternalError("aggregateLoss: unknown mode");
}

AggregationWeights aggregationWeights(const at::Tensor& mask, LossAggregation mode) {
  PTRAIN_CHECK(mask.dim() == 2, "aggregationWeights: mask must be [batch, length], got ", mask.sizes());
  const at::Tensor m = mask.to(torch::kFloat32);
  AggregationWeights out;
  switch (mode) {
    case LossAggregation::kTokenMean:
      out.weights = m;
      out.divisor = std::max(1.0, m.sum().item<double>());
      break;
    case LossAggregation::kSeqMeanTokenSum:
      out.weights = m;
      out.divisor = static_cast<double>(std::max<int64_t>(1, m.size(0)));
      break;
    case LossAggregation::kSeqMeanTokenMean:
      out.weights = m / m.sum(1, /*keepdim=*/true).clamp_min(1);
      out.divisor = static_cast<double>(std::max<int64_t>(1, m.size(0)));
      break;
  }
  return out;
}

PolicyLoss policyLoss(const at::Tensor& oldLogProb, const at::Tensor& logProb, const at::Tensor& advantages,
                      const at::Tensor& mask, const PolicyLossOptions& o) {
  PTRAIN_CHECK(o.clip_ratio_c > 1.0, "policyLoss: clip_ratio_c must be above 1, got ", o.clip_ratio_c);
  const at::Tensor negativeApproxKl = (logProb - oldLogProb).clamp(-20.0, 20.0);
  const at::Tensor ratio = negativeApproxKl.exp();
  PolicyLoss out;
  out.ppo_kl = maskedMean(-negativeApproxKl, mask).detach();
  const at::Tensor unclipped = -advantages * ratio;
  const at::Tensor clipped = -advantages * ratio.clamp(1.0 - o.clip_ratio_low, 1.0 + o.clip_ratio_high);
  const at::Tensor clipLoss = torch::maximum(unclipped, clipped);
  out.pg_clipfrac = maskedMean(clipped.gt(unclipped).to(torch::kFloat32), mask).detach();
  // Dual clip: for negative advantages the loss is bounded by -A c.
  const at::Tensor bound = -advantages * o.clip_ratio_c;
  const at::Tensor dualClipped = torch::minimum(bound, clipLoss);
  const at::Tensor negative = advantages.lt(0);
  out.pg_clipfrac_lower =
      maskedMean((clipLoss.gt(bound) & negative).to(torch::kFloat32), mask).detach();
  out.per_token = torch::where(negative, dualClipped, clipLoss);
  out.pg_loss = aggregateLoss(out.per_token, mask, o.aggregation);
  return out;
}

KlEstimator klEstimatorFromName(const std::string& name) {
  if (name == "kl" || name == "k1") return KlEstimator::kKl;
  if (name == "abs") return KlEstimator::kAbs;
  if (name == "mse" || name == "k2") return KlEstimator::kMse;
  if (name == "low_var_kl" || name == "k3") return KlEstimator::kLowVarKl;
  throw ConfigError("kl_loss_type: '" + name + "' is not one of kl (k1), abs, mse (k2), low_var_kl (k3)");
}

const char* toString(KlEstimator estimator) {
  switch (estimator) {
    case KlEstimator::kKl: return "kl";
    case KlEstimator::kAbs: return "abs";
    case KlEstimator::kMse: return "mse";
    case KlEstimator::kLowVarKl: return "low_var_kl";
  }
  return "?";
}

at::Tensor klPenalty(const at::Tensor& logProb, const at::Tensor& refLogProb, KlEstimator estimator) {
  switch (estimator) {
    case KlEstimator::kKl:
      return logProb - refLogProb;
    case KlEstimator::kAbs:
      return (logProb - refLogProb).abs();
    case KlEstimator::kMse:
      return 0.5 * (logProb - refLogProb).square();
    case KlEstimator::kLowVarKl: {
      // Unbiased and non-negative: r - log r - 1 with r = p_ref / p; the
      // clamps keep one wild token from dominating (as verl does).
      const at::Tensor kl = (refLogProb - logProb).clamp(-20.0, 20.0);
      return (kl.exp() - kl - 1).clamp(-10.0, 10.0);
    }
  }
  throw InternalError("klPenalty: unknown estimator");
}

at::Tensor entropyFromLogits(const at::Tensor& logits) {
  const at::Tensor z = logits.to(torch::kFloat32);
  return torch::logsumexp(z, -1) - (torch::softmax(z, -1) * z).sum(-1);
}

at::Tensor tokenLogProbs(const at::Tensor& logits, const at::Tensor& tokens) {
  const at::Tensor logp = torch::log_softmax(logits.to(torch::kFloat32), -1);
  return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
}

}  // namespace ptrain::grpo

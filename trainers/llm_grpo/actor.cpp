#include "actor.h"

#include <torch/torch.h>

#include "gpt_model.h"
#include "ptrain/comm/communicator.h"
#include "ptrain/comm/process_group.h"
#include "ptrain/engine/runtime.h"

namespace ptrain::grpo {

ActorStats updateActor(const GptModels& models, ModelRuntime& actor, const Batch& miniBatch, const ActorOptions& o, int64_t step) {
  const at::Tensor& mask = miniBatch.at("response_mask");
  const AggregationWeights aggregation = aggregationWeights(mask, o.policy.aggregation);
  Batch withWeights = miniBatch;
  withWeights.tensors["loss_weights"] = aggregation.weights;

  // Sums over this rank's micro-batches, in order: weighted pg loss, weighted
  // KL loss, clipped tokens, dual-clipped tokens, old - new log-probability,
  // entropy, response tokens.
  at::Tensor sums = torch::zeros({7}, torch::kFloat64);
  StepInput in;
  in.step = step;
  in.micro_batches = actor.microBatches(withWeights, o.micro_batch_size);
  in.loss_divisor = aggregation.divisor;
  in.loss = [&](StagedModel& model, const at::Tensor& hidden, const Batch& micro) {
    llm::GptModel& gpt = models.ownModel(model);
    const at::Tensor& m = micro.at("response_mask");
    const at::Tensor& w = micro.at("loss_weights");
    const at::Tensor logp = gpt.tokenLogProbs(hidden, micro.at("targets"));
    PolicyLoss pl = policyLoss(micro.at("old_log_probs"), logp, micro.at("advantages"), m, o.policy);
    at::Tensor perToken = pl.per_token;
    at::Tensor kl, entropy;
    if (o.use_kl_loss) {
      kl = klPenalty(logp, micro.at("ref_log_probs"), o.kl_loss_type);
      perToken = perToken + o.kl_loss_coef * kl;
    }
    if (o.entropy_coeff > 0) {
      entropy = entropyFromLogits(gpt.vocabularyLogits(hidden));
      perToken = perToken - o.entropy_coeff * entropy;
    } else {
      // Reported (actor/entropy) whether or not it is in the loss.
      torch::NoGradGuard noGrad;
      entropy = entropyFromLogits(gpt.vocabularyLogits(hidden.detach()));
    }
    {
      torch::NoGradGuard noGrad;
      const at::Tensor mf = m.to(torch::kFloat32);
      const double tokens = mf.sum().item<double>();
      sums[0] += (pl.per_token * w).sum().item<double>();
      if (kl.defined()) sums[1] += (kl * w).sum().item<double>();
      sums[2] += pl.pg_clipfrac.item<double>() * tokens;
      sums[3] += pl.pg_clipfrac_lower.item<double>() * tokens;
      sums[4] += pl.ppo_kl.item<double>() * tokens;
      if (entropy.defined()) sums[5] += (entropy * mf).sum().item<double>();
      sums[6] += tokens;
    }
    LossOutput out;
    out.loss_sum = (perToken * w).sum();
    out.count = m.sum().item<double>();
    return out;
  };
  const StepResult result = actor.step(in);

  // Over the data-parallel ranks (under device groups, over every group's).
  const std::vector<double> summed =
      actor.sumOverDataParallel(std::vector<double>(sums.data_ptr<double>(), sums.data_ptr<double>() + sums.numel()));
  sums = torch::tensor(summed, torch::kFloat64);
  const double tokens = std::max(1.0, sums[6].item<double>());
  ActorStats stats;
  stats.pg_loss = sums[0].item<double>() / aggregation.divisor;
  stats.kl_loss = sums[1].item<double>() / aggregation.divisor;
  stats.pg_clipfrac = sums[2].item<double>() / tokens;
  stats.pg_clipfrac_lower = sums[3].item<double>() / tokens;
  stats.ppo_kl = sums[4].item<double>() / tokens;
  stats.entropy = sums[5].item<double>() / tokens;
  stats.grad_norm = result.grad_norm;
  stats.lr = result.lr;
  stats.applied = result.applied;
  stats.nonfinite = result.nonfinite;
  return stats;
}

}  // namespace ptrain::grpo

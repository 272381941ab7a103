#include "grpo_step.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "ppo_batch.h"
#include "ptrain/core/error.h"
#include "ptrain/core/phase_timer.h"
#include "ptrain/engine/reshard.h"
#include "ptrain/engine/runtime.h"

namespace ptrain::grpo {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

GrpoStepResult grpoStep(const GptModels& models, ModelRuntime& actor, ModelRuntime& rollout, ModelRuntime* reference,
                        const std::vector<std::vector<int64_t>>& prompts, const RewardFunction& reward,
                        const GrpoOptions& o, int64_t step) {
  GrpoStepResult out;
  auto& m = out.metrics;
  const int64_t n = o.rollout.n;
  const auto start = Clock::now();
  // Everything before the actor's updates makes what they learn from.
  std::optional<PhaseScope> rolloutPhase(std::in_place, Phase::kRollout);

  auto t = Clock::now();
  reshardParameters(actor, rollout);
  m["timing_s/reshard"] = since(t);

  t = Clock::now();
  RolloutOptions sampling = o.rollout;
  sampling.seed = o.rollout.seed * 1000003ULL + static_cast<uint64_t>(step);
  out.rollout = generateOnLayout(models, rollout, prompts, sampling);
  m["timing_s/gen"] = since(t);

  const int64_t rows = static_cast<int64_t>(out.rollout.responses.size());
  double responseTokens = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const auto& response = out.rollout.responses[static_cast<size_t>(r)];
    out.scores.push_back(reward(r / n, response));
    responseTokens += static_cast<double>(response.size());
  }
  const at::Tensor scores = torch::tensor(out.scores, torch::kFloat64).to(torch::kFloat32);
  m["critic/score/mean"] = scores.mean().item<double>();
  m["critic/score/max"] = scores.max().item<double>();
  m["critic/score/min"] = scores.min().item<double>();
  m["response_length/mean"] = responseTokens / static_cast<double>(std::max<int64_t>(1, rows));

  const at::Tensor advantages = groupAdvantages(scores, n, o.norm_adv_by_std_in_grpo);
  Batch batch = ppoBatch(out.rollout, advantages, o.rollout.pad_id);
  m["critic/advantages/mean"] = maskedMean(batch.at("advantages"), batch.at("response_mask")).item<double>();

  const int64_t prompts_ = static_cast<int64_t>(prompts.size());
  const int64_t mini = o.ppo_mini_batch_size > 0 ? o.ppo_mini_batch_size : prompts_;
  PTRAIN_CHECK_AS(ConfigError, prompts_ % mini == 0, "ppo_mini_batch_size=", mini, " does not divide the ",
                  prompts_, " prompts of a step");
  // Mini-batch by mini-batch, so that each rank computes the old and the
  // reference log-probabilities of the very rows it trains on, in its own
  // layout: under device groups a group's rows of a mini-batch are not its
  // rows of the whole batch, and a probability ratio between two layouts'
  // roundings, or a KL term between them, would not be exactly 1 or 0 where
  // one layout gives exactly that (Adam turns even 1e-7 into a full step).
  auto byMiniBatch = [&](ModelRuntime& runtime, int64_t microBatchSize) {
    std::vector<at::Tensor> parts;
    for (int64_t first = 0; first < prompts_; first += mini)
      parts.push_back(targetLogProbs(models, runtime, batch.slice(first * n, (first + mini) * n), microBatchSize));
    return torch::cat(parts, 0);
  };
  t = Clock::now();
  batch.tensors["old_log_probs"] = byMiniBatch(actor, o.log_prob_micro_batch_size);
  m["timing_s/old_log_prob"] = since(t);
  t = Clock::now();
  batch.tensors["ref_log_probs"] =
      reference != nullptr ? byMiniBatch(*reference, o.ref_log_prob_micro_batch_size) : batch.at("old_log_probs");
  m["timing_s/ref"] = since(t);

  // PPO epochs over mini-batches of whole prompt groups.
  rolloutPhase.reset();
  t = Clock::now();
  std::map<std::string, double> sums;
  int64_t updates = 0;
  int64_t nonfiniteUpdates = 0;
  double lastLr = 0;
  for (int64_t epoch = 0; epoch < o.ppo_epochs; ++epoch) {
    for (int64_t first = 0; first < prompts_; first += mini) {
      const Batch slice = batch.slice(first * n, (first + mini) * n);
      const ActorStats s = updateActor(models, actor, slice, o.actor, step * 1000 + updates);
      sums["actor/pg_loss"] += s.pg_loss;
      sums["actor/pg_clipfrac"] += s.pg_clipfrac;
      sums["actor/pg_clipfrac_lower"] += s.pg_clipfrac_lower;
      sums["actor/ppo_kl"] += s.ppo_kl;
      sums["actor/kl_loss"] += s.kl_loss;
      sums["actor/entropy"] += s.entropy;
      sums["actor/grad_norm"] += s.grad_norm;
      nonfiniteUpdates += s.nonfinite ? 1 : 0;
      lastLr = s.lr;
      ++updates;
    }
  }
  for (const auto& [k, v] : sums) m[k] = v / static_cast<double>(std::max<int64_t>(1, updates));
  // Updates the runtime left out for a NaN or inf (train.on_nonfinite).
  m["actor/nonfinite_updates"] = static_cast<double>(nonfiniteUpdates);
  m["actor/lr"] = lastLr;
  m["timing_s/update_actor"] = since(t);
  m["timing_s/step"] = since(start);
  m["perf/throughput"] = responseTokens / std::max(1e-9, m["timing_s/step"]);
  out.batch = std::move(batch);
  return out;
}

}  // namespace ptrain::grpo

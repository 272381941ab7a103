// The actor's PPO update on one mini-batch of rollouts, as a ModelRuntime
// step: the clipped policy loss, the KL loss to the reference and the entropy
// bonus per token, aggregated by loss_agg_mode through per-token weights and
// one divisor counted on the whole mini-batch, so that any split into
// micro-batches and data-parallel ranks takes the same step.
#pragma once

#include <cstdint>

#include "core_algos.h"
#include "ptrain/engine/batch.h"
#include "rollout.h"

namespace ptrain {
class ModelRuntime;
}

namespace ptrain::grpo {

struct ActorOptions {
  PolicyLossOptions policy;
  bool use_kl_loss = true;       // actor.use_kl_loss
  double kl_loss_coef = 0.001;   // actor.kl_loss_coef
  KlEstimator kl_loss_type = KlEstimator::kLowVarKl;
  double entropy_coeff = 0;      // actor.entropy_coeff (0: entropy reported, not in the loss)
  int64_t micro_batch_size = 0;  // rows per micro-batch on a rank (ppo_micro_batch_size_per_gpu); 0: all
};

// Means over the mini-batch's response tokens (pg_loss and kl_loss as the
// loss aggregates them), summed over the data-parallel ranks.
struct ActorStats {
  double pg_loss = 0, pg_clipfrac = 0, pg_clipfrac_lower = 0, ppo_kl = 0, kl_loss = 0, entropy = 0;
  double grad_norm = 0;
  double lr = 0;  // of this update
  bool applied = true;
  bool nonfinite = false;  // StepResult::nonfinite: not applied for a NaN or inf no hook owned
};

// One optimizer step of `actor` (a GPT, pp 1) on `miniBatch`, the whole
// mini-batch as every rank sees it: "tokens" [rows, length] (prompt and
// response, padded), "targets" (each position's next token), "response_mask"
// (1 where the target is a response token), "old_log_probs" and
// "ref_log_probs" of the targets, "advantages" (per token). Collective over
// the world.
ActorStats updateActor(const GptModels& models, ModelRuntime& actor, const Batch& miniBatch, const ActorOptions& options, int64_t step);

}  // namespace ptrain::grpo

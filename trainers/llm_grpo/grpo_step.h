// One GRPO iteration over a batch of prompts, in verl's order: the actor's
// weights to the rollout's layout, sampling n responses per prompt, rewards,
// group advantages, the old and reference log-probabilities, then PPO epochs
// over mini-batches of the actor's update. Each phase is timed; the metrics
// carry verl's names.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "actor.h"
#include "rollout.h"

namespace ptrain {
class ModelRuntime;
}

namespace ptrain::grpo {

struct GrpoOptions {
  RolloutOptions rollout;             // n, sampling, lengths; its seed is mixed with the step
  ActorOptions actor;
  bool norm_adv_by_std_in_grpo = true;
  int64_t ppo_mini_batch_size = 0;    // prompts per mini-batch (each brings its n samples); 0: all
  int64_t ppo_epochs = 1;
  int64_t log_prob_micro_batch_size = 0;      // rows per micro-batch of the old log-probabilities (rollout.*)
  int64_t ref_log_prob_micro_batch_size = 0;  // the same for the reference's (ref.*)
};

// The score of response `response` to prompt `prompt` (an index into the batch).
using RewardFunction = std::function<double(int64_t prompt, const std::vector<int64_t>& response)>;

struct GrpoStepResult {
  Rollout rollout;
  std::vector<double> scores;             // per sample
  // The PPO batch the actor trained on (ppoBatch): tokens, targets,
  // response_mask, advantages, old_log_probs, ref_log_probs.
  Batch batch;
  std::map<std::string, double> metrics;  // actor/pg_loss, critic/score/mean, timing_s/gen, ...
};

// Collective over the world. `reference` may be null (no KL loss then).
// `step` numbers the iteration (the rollout's seed, the actor's steps).
GrpoStepResult grpoStep(const GptModels& models, ModelRuntime& actor, ModelRuntime& rollout, ModelRuntime* reference,
                        const std::vector<std::vector<int64_t>>& prompts, const RewardFunction& reward,
                        const GrpoOptions& options, int64_t step);

}  // namespace ptrain::grpo

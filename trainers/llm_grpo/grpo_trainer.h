// GrpoTrainer: the `llm_grpo` trainer plugin. Reinforcement learning of the
// llm trainer's GPT on arithmetic with GRPO, in verl's style: an actor
// trained with the clipped policy loss (actor.h), a frozen reference for the
// KL loss, and a rollout model on its own tensor-parallel layout that samples
// `rollout.n` responses per prompt (rollout.h), all on the world's ranks.
// Each step is grpoStep (grpo_step.h); its model, data and evaluation are the
// llm trainer's (model.*, data.operations, data.digits, data.eval_size;
// eval_exact_match on held-out problems).
//
// Keys, in verl's names (docs/trainers/grpo.md): data.train_batch_size
// (prompts per step), data.max_response_length; actor_rollout_ref.model.path
// (the supervised run to start from); actor_rollout_ref.actor.* (the PPO
// update), .rollout.* (sampling and the rollout's tensor-parallel size),
// .ref.* (the reference); algorithm.* (advantages, format reward, rollout
// dumps). The actor's layout is the recipe's parallel.* (the core's keys), and
// the core's train.global_batch_size / micro_batch_size must be the actor's
// optimizer step (ppo_mini_batch_size * rollout.n samples,
// ppo_micro_batch_size_per_gpu), so that `ptrain check` and `ptrain plan`
// size the actor's step.
#pragma once

#include <memory>
#include <string>

#include "grpo_step.h"
#include "llm_trainer.h"
#include "reward.h"

namespace ptrain::grpo {

class GrpoTrainer : public llm::LlmTrainer {
 public:
  explicit GrpoTrainer(const PluginContext& context);

  void describeKeys(Schema& schema) const override;
  // The llm trainer's checks, then verl's known failures (checks.h) for this
  // world size, one line each, and keys that do not agree with the actor's
  // step. Throws ConfigError.
  void setup(const Recipe& recipe) override;
  // Prompts are consumed data.train_batch_size a step (not the actor's
  // global batch of responses).
  nlohmann::json dataPosition(int64_t step, int64_t) const override {
    return LlmTrainer::dataPosition(step, train_batch_size_);
  }
  // No MFU: a step is generation, scoring and several updates over the
  // responses, which no count of the llm trainer's per-token FLOPs describes.
  double trainFlops(double) const override { return 0; }
  // The actor (parallel.*), the reference (the actor's layout, optionally
  // offloaded) and the rollout (actor_rollout_ref.rollout.tensor_model_
  // parallel_size x the rest as data parallelism), one grpoStep a step,
  // through the engine's loop (runTrainingLoop, engine.h): evaluation before
  // the first step and as for every trainer, metrics, progress, checkpoints of
  // the actor.
  TrainSummary train(TrainingSession& session) override;

 private:
  // Prompts of step `step`: problems 0..train_batch_size-1 of the dataset's
  // training stream, and their answers.
  void promptsOf(int64_t step, std::vector<std::vector<int64_t>>& prompts, std::vector<std::string>& answers) const;
  // Rank 0: appends step `step`'s samples to RUN_DIR/rollouts.jsonl.
  void dumpRollouts(const std::string& runDir, int64_t step, const GrpoStepResult& result,
                    const std::vector<std::string>& answers) const;

  int world_size_ = 1;
  GrpoOptions options_;
  RewardOptions reward_;
  int64_t train_batch_size_ = 1;
  int64_t rollout_tp_ = 1;
  bool use_reference_ = true;
  bool ref_param_offload_ = false;
  int64_t dump_rollouts_ = 0;
  std::string init_from_;
};

}  // namespace ptrain::grpo

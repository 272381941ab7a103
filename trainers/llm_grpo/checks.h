// The configurations verl is known to fail on, caught before launch, one line
// each with the fix (what `ptrain check` says for a GRPO recipe). Keys are
// named as in verl's recipes (actor_rollout_ref.*, data.*); the actor's
// layout is the recipe's parallel.*, whose own checks (tp dividing the world
// and the heads, sequence parallelism) the core's layout validation makes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptrain::grpo {

struct GrpoLayoutRequest {
  int64_t world = 1;
  int64_t train_batch_size = 1;               // data.train_batch_size: prompts per step
  int64_t rollout_n = 1;                      // actor_rollout_ref.rollout.n
  int64_t actor_tp = 1;                       // parallel.tensor_model_parallel_size
  int64_t rollout_tp = 1;                     // actor_rollout_ref.rollout.tensor_model_parallel_size
  int64_t ppo_mini_batch_size = 1;            // actor_rollout_ref.actor.ppo_mini_batch_size (prompts)
  int64_t ppo_micro_batch_size_per_gpu = 1;   // actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (samples)
  int64_t num_attention_heads = 0;            // model.num_attention_heads; 0: not checked
  int64_t padded_vocab = 0;                   // the embedding's rows after padding; 0: not checked
  // A device group's layout (parallel.groups): `world`, `actor_tp` and
  // `rollout_tp` are the group's, `samples` and `mini_samples` its rows of a
  // step's and of a mini-batch's samples, and every line names it ("" and 0:
  // the job's own layout, train_batch_size x n and ppo_mini_batch_size x n).
  std::string group;
  int64_t samples = 0;
  int64_t mini_samples = 0;
};

// Every problem, one line each; empty when the layout can run.
std::vector<std::string> checkGrpoLayout(const GrpoLayoutRequest& request);

}  // namespace ptrain::grpo

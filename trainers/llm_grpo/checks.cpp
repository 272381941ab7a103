#include "checks.h"

#include <algorithm>
#include <numeric>

namespace ptrain::grpo {
namespace {

std::string n(int64_t x) { return std::to_string(x); }

// The divisors of `x`, "1, 2, 4".
std::string divisorsOf(int64_t x) {
  std::string out;
  for (int64_t d = 1; d <= x; ++d)
    if (x % d == 0) out += (out.empty() ? "" : ", ") + n(d);
  return out;
}

// The multiples of `step` on either side of `x`.
std::string near(int64_t x, int64_t step) {
  const int64_t lo = x / step * step;
  return lo > 0 ? n(lo) + " or " + n(lo + step) : n(step);
}

}  // namespace

std::vector<std::string> checkGrpoLayout(const GrpoLayoutRequest& q) {
  std::vector<std::string> out;
  const std::string rollout = "actor_rollout_ref.rollout.", actor = "actor_rollout_ref.actor.";
  const bool grouped = !q.group.empty();
  // A group's rows come from the shares: its fix is theirs, not one of the batch sizes.
  auto orShares = [&](const std::string& jobFix) {
    return grouped ? "change the device groups' shares or data.train_batch_size" : jobFix;
  };
  const std::string worldName = grouped ? "the group's ranks " : "the world size ";
  const int64_t samples = q.samples > 0 ? q.samples : q.train_batch_size * q.rollout_n;
  const std::string samplesText = grouped ? "the group's " + n(samples) + " samples of a step"
                                          : "data.train_batch_size * rollout.n = " + n(samples) + " samples";
  if (q.world % q.rollout_tp != 0) {
    out.push_back(rollout + "tensor_model_parallel_size=" + n(q.rollout_tp) + " does not divide " + worldName +
                  n(q.world) + ": use " + divisorsOf(q.world));
  } else {
    const int64_t rolloutDp = q.world / q.rollout_tp;
    if (samples % rolloutDp != 0) {
      const int64_t unit = rolloutDp / std::gcd(rolloutDp, q.rollout_n);
      out.push_back(samplesText + " do not split into the rollout's " + n(rolloutDp) + " data-parallel ranks (" +
                    (grouped ? "the group's ranks " : "world ") + n(q.world) + " / " + rollout +
                    "tensor_model_parallel_size " + n(q.rollout_tp) +
                    "): " + orShares("use data.train_batch_size " + near(q.train_batch_size, unit)));
    }
  }
  // The step's prompts into mini-batches: the job's, checked once.
  if (!grouped && q.ppo_mini_batch_size > q.train_batch_size) {
    out.push_back(actor + "ppo_mini_batch_size=" + n(q.ppo_mini_batch_size) + " is above data.train_batch_size=" +
                  n(q.train_batch_size) + ": a mini-batch is part of a step's prompts; use at most " +
                  n(q.train_batch_size));
  } else if (!grouped && q.train_batch_size % q.ppo_mini_batch_size != 0) {
    out.push_back(actor + "ppo_mini_batch_size=" + n(q.ppo_mini_batch_size) + " does not divide data.train_batch_size=" +
                  n(q.train_batch_size) + ": use " + divisorsOf(q.train_batch_size));
  }
  if (q.world % q.actor_tp == 0) {
    const int64_t dp = q.world / q.actor_tp;
    const int64_t micro = q.ppo_micro_batch_size_per_gpu;
    if (samples % (dp * micro) != 0) {
      // train_batch_size * n divides by dp * micro exactly when
      // train_batch_size is a multiple of dp * micro / gcd(dp * micro, n).
      const int64_t unit = dp * micro / std::gcd(dp * micro, q.rollout_n);
      out.push_back(samplesText + " do not split into the actor's " + n(dp) + " data-parallel ranks x " + actor +
                    "ppo_micro_batch_size_per_gpu=" + n(micro) + ": " +
                    orShares("use data.train_batch_size " + near(q.train_batch_size, unit)) +
                    (samples % dp == 0 ? ", or ppo_micro_batch_size_per_gpu " + divisorsOf(samples / dp) : ""));
    }
    const int64_t miniSamples = q.mini_samples > 0 ? q.mini_samples : q.ppo_mini_batch_size * q.rollout_n;
    // Checked once the whole batch splits (a mini-batch of all of it is the same check).
    if (samples % (dp * micro) == 0 && miniSamples % (dp * micro) != 0) {
      out.push_back(actor + "ppo_mini_batch_size=" + n(q.ppo_mini_batch_size) + " (x rollout.n = " +
                    n(q.ppo_mini_batch_size * q.rollout_n) + " samples" +
                    (grouped ? ", " + n(miniSamples) + " of them the group's" : "") + ") does not split into " +
                    n(dp) + " data-parallel ranks x ppo_micro_batch_size_per_gpu=" + n(micro) + ": make " +
                    (grouped ? "the group's share of it" : "ppo_mini_batch_size * rollout.n") + " a multiple of " +
                    n(dp * micro));
    }
  }
  if (q.num_attention_heads > 0 && q.num_attention_heads % q.rollout_tp != 0) {
    out.push_back(rollout + "tensor_model_parallel_size=" + n(q.rollout_tp) +
                  " does not divide model.num_attention_heads=" + n(q.num_attention_heads) + ": use " +
                  divisorsOf(q.num_attention_heads));
  }
  if (q.padded_vocab > 0 && q.padded_vocab % q.rollout_tp != 0) {
    out.push_back(rollout + "tensor_model_parallel_size=" + n(q.rollout_tp) + " does not divide the padded vocabulary of " +
                  n(q.padded_vocab) + " rows: use a model.make_vocab_size_divisible_by that it divides");
  }
  if (grouped)
    for (auto& line : out) line = q.group + ": " + line;
  return out;
}

}  // namespace ptrain::grpo

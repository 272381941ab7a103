// Engine: the training loop of one rank.
//
// Per step: draw the global batch (same on every rank), take this
// data-parallel rank's slice, run forward/backward over its micro-batches
// (loss scaled by 1 / items in the global batch), let the parallel plugins
// finish the gradients, clip, update, then log metrics (rank 0), evaluate
// every train.eval_every steps and checkpoint every checkpoint.every steps.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "ptrain/comm/rank_env.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain {

class PluginRegistry;
class Trainer;

// A recipe loaded, validated against the core and trainer schemas, with its
// layout checked against the world size and the trainer set up. Shared by
// `ptrain check` and `ptrain run` so both accept and refuse the same recipes.
struct PTRAIN_API PreparedRecipe {
  Recipe recipe;
  std::unique_ptr<PluginRegistry> registry;
  std::unique_ptr<Trainer> trainer;
  int world_size = 1;
  std::vector<std::string> warnings;

  PreparedRecipe();
  ~PreparedRecipe();
  PreparedRecipe(PreparedRecipe&&) noexcept;
};

// Throws ConfigError / PluginLoadError. A layout that does not fit throws one
// ConfigError whose message has one line per problem. `worldSize` 0 means
// launch.nproc.
PTRAIN_API PreparedRecipe prepareRecipe(const std::string& path, const std::vector<std::string>& overrides,
                                        int worldSize, int rank = 0);

struct TrainSummary {
  int64_t steps = 0;
  double final_loss = 0;
  std::map<std::string, double> eval;  // last evaluation
  double tokens_per_s = 0;
  double wall_s = 0;
};

struct EngineOptions {
  std::string run_dir;
  bool resume = false;
};

// Trains on this rank. Collective: every rank of the job runs it together.
PTRAIN_API TrainSummary train(PreparedRecipe& prepared, const RankEnv& env, const EngineOptions& options);

}  // namespace ptrain

// Engine: a run of a recipe on one rank.
//
// train() opens a TrainingSession (communicator, run folder, metrics,
// checkpoints) and hands it to the trainer, whose default train() is
// defaultTrainingLoop: one ModelRuntime on the recipe's layout and, per
// step, the global batch (the same on every rank), this data-parallel rank's
// micro-batches, runtime.step(), metrics (rank 0), evaluation every
// train.eval_every steps and a checkpoint every checkpoint.every steps.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptrain/comm/rank_env.h"
#include "ptrain/engine/runtime.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain {

class Communicator;
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

// Throws ConfigError / PluginLoadError. A layout that does not fit (or a
// communication.nccl entry NCCL's table refuses, comm/nccl_settings.h) throws
// one ConfigError whose message has one line per problem. `worldSize` 0 means
// launch.nproc.
PTRAIN_API PreparedRecipe prepareRecipe(const std::string& path, const std::vector<std::string>& overrides,
                                        int worldSize, int rank = 0);

struct TrainSummary {
  int64_t steps = 0;
  double final_loss = 0;
  std::map<std::string, double> eval;  // last evaluation
  double tokens_per_s = 0;  // of the trainer's throughputUnit()
  std::string throughput_unit = "tokens";
  double wall_s = 0;
};

struct EngineOptions {
  std::string run_dir;
  bool resume = false;
};

// What a training run gives its trainer: the recipe, the communicator, the
// run folder, runtimes on any layout of the job's ranks, metrics and
// checkpoints. One per rank; every rank makes the same calls in the same order.
class PTRAIN_API TrainingSession {
 public:
  // Rendezvous with the other ranks (collective). Throws what the
  // communicator throws.
  TrainingSession(PreparedRecipe& prepared, const RankEnv& env, EngineOptions options);
  ~TrainingSession();
  TrainingSession(const TrainingSession&) = delete;
  TrainingSession& operator=(const TrainingSession&) = delete;

  const Recipe& recipe() const { return prepared_.recipe; }
  Trainer& trainer() { return *prepared_.trainer; }
  PluginRegistry& registry() { return *prepared_.registry; }
  Communicator& comm() { return *comm_; }
  const RankEnv& env() const { return env_; }
  const std::string& runDir() const { return options_.run_dir; }
  bool resuming() const { return options_.resume; }
  bool isRankZero() const { return env_.rank == 0; }
  at::Device device() const { return device_; }

  // Options of the recipe's own model: named "model", on the recipe's
  // layout, device, seed and precision, with its optimizer and parallel.*
  // options.
  RuntimeOptions runtimeOptions() const;
  // A runtime built by the trainer's buildModel (collective).
  std::unique_ptr<ModelRuntime> makeRuntime(RuntimeOptions options);

  // Appends a line to RUN_DIR/metrics.jsonl (rank 0; others ignore it).
  void writeMetrics(const nlohmann::json& line);
  // Saves every runtime's share and `extra` (merged into meta.json) as
  // checkpoint `step`, atomically, keeping checkpoint.keep of them.
  // Collective over the world.
  void saveCheckpoint(int64_t step, const std::vector<ModelRuntime*>& runtimes, const nlohmann::json& extra = {});
  // Loads the newest checkpoint into the runtimes and restores the RNG
  // state; returns its step. Throws CheckpointError when there is none, or it
  // is corrupt or holds other models. Collective over the world.
  int64_t restoreLatest(const std::vector<ModelRuntime*>& runtimes);
  // Loads the newest weights of another run (`runDir`, its first file of
  // `files` that exists) into the runtimes; optimizers stay fresh. Returns
  // that checkpoint's step. Throws CheckpointError. Collective over the world.
  int64_t loadWeightsFrom(const std::string& runDir, const std::vector<std::string>& files,
                          const std::vector<ModelRuntime*>& runtimes);

 private:
  PreparedRecipe& prepared_;
  RankEnv env_;
  EngineOptions options_;
  at::Device device_{at::kCPU};
  std::unique_ptr<Communicator> comm_;
  struct Metrics;
  std::unique_ptr<Metrics> metrics_;
};

// The engine's training loop over one runtime (Trainer::train's default).
PTRAIN_API TrainSummary defaultTrainingLoop(TrainingSession& session, Trainer& trainer);
// The same loop over a runtime made with `options` (session.runtimeOptions()
// changed by the trainer, e.g. a sparse optimizer for its tables).
PTRAIN_API TrainSummary defaultTrainingLoop(TrainingSession& session, Trainer& trainer, const RuntimeOptions& options);

// Trains on this rank. Collective: every rank of the job runs it together.
PTRAIN_API TrainSummary train(PreparedRecipe& prepared, const RankEnv& env, const EngineOptions& options);

}  // namespace ptrain

// Engine: a run of a recipe on one rank.
//
// train() opens a TrainingSession (communicator, run folder, metrics,
// checkpoints) and hands it to the trainer, whose default train() is
// defaultTrainingLoop: one ModelRuntime on the recipe's layout and, per
// step, the global batch (the same on every rank), this data-parallel rank's
// micro-batches, runtime.step(), metrics (rank 0), evaluation every
// train.eval_every steps and a checkpoint every checkpoint.every steps.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptrain/comm/rank_env.h"
#include "ptrain/engine/runtime.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain {

struct LayoutRequest;

class Communicator;
class DeviceGroups;
struct DeviceGroup;
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

// What `ptrain run --resume` lists before it continues a run with another
// recipe: every key whose resolved value differs between the recipe the run
// was started with (`beforePath`, RUN_DIR/recipe.yaml) and `after`, one line
// each, "key: old -> new" ("(not set)" where a side has none); empty when
// they agree. `before` is resolved against `after`'s schema (the core keys
// and its trainer's). Throws ConfigError when `beforePath` cannot be read.
PTRAIN_API std::vector<std::string> recipeChanges(const std::string& beforePath, const PreparedRecipe& after);

// A layout that splits parameters (tp, or ep / etp for a model with experts,
// above 1) needs a model that builds only each rank's slice of them: builds
// the trainer's model (set up) whole without storage, as a runtime does
// (nn::DeferredInit: next to no memory), and throws ConfigError at the
// parallel key when it cannot (checkShardedBuild, engine/model.h).
// prepareRecipe and `ptrain check` call it.
PTRAIN_API void checkModelBuildsSlices(const Recipe& recipe, const LayoutRequest& layout, Trainer& trainer);

struct TrainSummary {
  int64_t steps = 0;
  double final_loss = 0;
  std::map<std::string, double> eval;  // last evaluation
  double tokens_per_s = 0;  // of the trainer's throughputUnit()
  std::string throughput_unit = "tokens";
  double wall_s = 0;
  // Seconds from launch to the first training step (metrics' startup_s).
  double startup_s = 0;
  // Checkpoints saved, and over all of them the slowest rank's seconds and
  // every rank's bytes summed; the load a resumed run began with, likewise.
  int64_t checkpoint_saves = 0;
  double checkpoint_save_s = 0;
  double checkpoint_save_bytes = 0;
  double checkpoint_load_s = 0;
  double checkpoint_load_bytes = 0;
  // Each rank's peak resident set over the whole run (MiB), by rank.
  std::vector<double> peak_rss_mb_ranks;
  // Rank 0's seconds in each phase of its training steps (core/phase_timer.h:
  // "data", "forward_backward", ..., "checkpoint", "other"), over every step
  // of this run; they add up to step_time_s, the steps' seconds in all.
  std::map<std::string, double> phase_s;
  double step_time_s = 0;
  // Under parallel.groups: this rank's seconds in the groups' gradient
  // exchange over the same steps (CrossGroupGradients: the transfer, and the
  // wait for a slower group).
  double cross_group_s = 0;
  // Model FLOPs of the steps (Trainer::trainFlops) over their seconds and the
  // devices' peak (EngineOptions::device_peak_flops or the host's measured
  // product rate), as a fraction; < 0 where the trainer does not count them.
  double mfu = -1;
};

struct EngineOptions {
  std::string run_dir;
  bool resume = false;
  // With resume: the checkpoint step to resume from (-1: the newest).
  int64_t resume_step = -1;
  // One device's peak FLOP/s in the run's precision, for MFU (`ptrain run`
  // gives the plan's table's rate of the GPU it runs on); 0: on the cpu, the
  // rate of float32 products this host measures at start, and on a GPU
  // without an entry, no MFU.
  double device_peak_flops = 0;
  // With resume: called on rank 0 with the step once its checkpoint has
  // loaded (every rank refuses a checkpoint alike). `ptrain run` records a
  // changed recipe here, so that a refused resume leaves the run folder as
  // it found it.
  std::function<void(int64_t step)> on_resumed;
};

// The signal names checkpoint.on_signal accepts, and their numbers.
PTRAIN_API int stopSignalNumber(const std::string& name);  // 0 when not one of them
// Problems with checkpoint.on_signal (one line each; empty when fine).
PTRAIN_API std::vector<std::string> checkStopSignals(const Recipe& recipe);
// Problems with log.profile_steps: [] or [A, B] with 1 <= A <= B <=
// train.steps (one line each; empty when fine).
PTRAIN_API std::vector<std::string> checkProfileSteps(const Recipe& recipe);

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
  // The job's communicator (every rank).
  Communicator& comm() { return *comm_; }
  // Under parallel.groups (layout/device_groups.h): the groups, this rank's
  // group and that group's own communicator, which its runtimes are built on
  // (runtimeOptions, makeRuntime); null without groups.
  const DeviceGroups* deviceGroups() const { return deviceGroups_.get(); }
  const DeviceGroup* deviceGroup() const;
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

  // Appends `row` to RUN_DIR/metrics.jsonl with its `kind` ("train",
  // "eval", "startup", "checkpoint", "summary") and `time` (seconds since
  // the epoch), and, under log.tensorboard, its numbers as TensorBoard
  // scalars "<kind>/<field>" at its "step" (a list: one per rank,
  // "<kind>/<field>/rank<R>"). Rank 0; others ignore it.
  void writeMetrics(const std::string& kind, nlohmann::json row);
  // Call right before the first training step: writes the startup row
  // ({"step", "startup_s"}: seconds since launch, core/resources.h, and the
  // device peak MFU is measured against, "peak_flops"). The engine's loop
  // calls it.
  void beginTraining(int64_t step);
  // One device's peak FLOP/s for MFU (EngineOptions::device_peak_flops, or
  // on the cpu this host's measured rate); 0 when not known.
  double devicePeakFlops() const { return peakFlops_; }
  // Saves every runtime's share and `extra` (merged into meta.json) as
  // checkpoint `step`, atomically, keeping checkpoint.keep of them: each rank
  // writes what it owns (engine/sharded_checkpoint.h). Writes each rank's
  // seconds and bytes to metrics.jsonl ({"step", "checkpoint_save_s": [per
  // rank], "checkpoint_save_bytes": [per rank]}). Collective over the world.
  void saveCheckpoint(int64_t step, const std::vector<ModelRuntime*>& runtimes, const nlohmann::json& extra = {});
  // Loads the newest checkpoint into the runtimes (each rank reading its
  // blocks, from a checkpoint of any layout or precision) and restores the
  // RNG state; returns its step. Writes each rank's seconds and bytes read
  // ("checkpoint_load_s", "checkpoint_load_bytes"). Throws CheckpointError on
  // every rank when there is none, or it is damaged or holds other models.
  // Collective over the world.
  int64_t restoreLatest(const std::vector<ModelRuntime*>& runtimes);
  // Loads the newest weights of another run (`runDir`; the first of
  // `sources`, runtime names such as "model" or "actor", that its checkpoint
  // holds) into the runtimes; optimizers stay fresh. Returns that
  // checkpoint's step. Throws CheckpointError. Collective over the world.
  int64_t loadWeightsFrom(const std::string& runDir, const std::vector<std::string>& sources,
                          const std::vector<ModelRuntime*>& runtimes);
  // Applies train.on_nonfinite after a training step (every rank calls it
  // with the same values): a step that is `nonfinite` (StepResult::nonfinite:
  // its loss or gradient norm was NaN or inf and no hook, such as fp16's loss
  // scaler, owned the skip) throws NonFiniteError (exit code 4) under `stop`,
  // naming the step, its `loss` and `gradNorm` and the newest checkpoint;
  // under `skip` it is counted (logged on rank 0) until
  // train.nonfinite_skip_limit of them in a row end the run the same way.
  // Returns the steps skipped so far.
  int64_t checkStepFinite(int64_t step, double loss, double gradNorm, bool nonfinite);
  // After every training step (each loop calls it): this rank's step in the
  // rendezvous store, so that a collective that times out can name the ranks
  // that were behind (train() adds them to the TimeoutError's line). Nothing
  // on one rank.
  void recordStepReached(int64_t step);
  // After a TimeoutError: marks this rank as timed out in the store, waits a
  // few seconds for the others to do the same, and returns "; the peer that
  // did not arrive: rank 1 (last finished step 12)" for those that did not
  // (stuck or gone), or "" when it cannot say (one rank, no store).
  std::string missingPeers();
  // Whether the run was asked to stop: true on every rank when any rank got
  // one of checkpoint.on_signal's signals since the run began. Collective
  // over the world when on_signal lists any (call it at every step boundary
  // on every rank); false, without communicating, when it lists none.
  bool stopRequested();
  // After the loop saved checkpoint `step` because stopRequested(): throws
  // StoppedBySignal (exit code 75) saying which signal, the step saved and
  // the command that resumes.
  [[noreturn]] void stopAfterSave(int64_t step);
  // The start-up and checkpoint figures so far, and every rank's peak
  // resident set, into `summary`, and the peaks to metrics.jsonl ({"step",
  // "peak_rss_mb_ranks": [per rank]}). Collective over the world; train()
  // calls it for every trainer once it has finished.
  void addFigures(TrainSummary& summary);

 private:
  PreparedRecipe& prepared_;
  RankEnv env_;
  EngineOptions options_;
  at::Device device_{at::kCPU};
  std::unique_ptr<Communicator> comm_;
  std::shared_ptr<const DeviceGroups> deviceGroups_;  // parallel.groups
  int deviceGroup_ = 0;
  std::unique_ptr<Communicator> groupComm_;  // the group's part of comm_
  struct Metrics;
  std::unique_ptr<Metrics> metrics_;
  TrainSummary figures_;  // startup_s and the checkpoint_* fields
  double peakFlops_ = 0;
  int64_t nonfiniteInARow_ = 0;
  int64_t nonfiniteSkipped_ = 0;
  std::vector<int> stopSignals_;  // checkpoint.on_signal, whose handlers this session installed
  bool stopAgreed_ = false;
  int stopSignalSeen_ = 0;
  // Each rank's seconds and bytes of one save or load, to metrics.jsonl.
  void recordIo(int64_t step, const char* what, double seconds, double bytes);
};

// What one training step reports to the engine's loop: its row of
// metrics.jsonl and its progress line.
struct StepReport {
  double loss = 0;       // the step's training loss (what the progress line shows)
  double lr = 0;         // learning rate of the step's (last) update
  double grad_norm = 0;  // before clipping, of the step's (last) update
  // Its loss or gradient norm was not finite and nothing (an fp16 loss
  // scale) owned the skip: train.on_nonfinite decides.
  bool nonfinite = false;
  bool applied = true;   // false: the update was skipped (written as "skipped")
  double items = 0;      // of the trainer's throughputUnit(), over every rank
  int64_t micro_batches = 0;  // rank 0's, per step
  nlohmann::json metrics = nlohmann::json::object();  // further fields of the row
  std::string note;      // after the loss on the progress line (e.g. fp16's scale)
};

// One training run's steps, as the engine's loop drives them. The loop
// (runTrainingLoop) does the rest alike for every trainer: resume and
// checkpoint.load, the progress display (log.progress), one metrics.jsonl row
// per step with the operator count (log.count_ops), train.on_nonfinite,
// evaluation every train.eval_every steps and after the last, checkpoints
// (checkpoint.every, save_final), the stop signals (checkpoint.on_signal),
// each step's phase timers (core/phase_timer.h: a task marks its data with
// Phase::kData, the runtime the rest), MFU (Trainer::trainFlops) and memory,
// TensorBoard (log.tensorboard) and the profiler's window (log.profile_steps).
// Every rank makes the same calls in the same order.
class PTRAIN_API TrainingTask {
 public:
  virtual ~TrainingTask();
  // The runtimes a checkpoint holds and a resume restores, in that order.
  virtual std::vector<ModelRuntime*> checkpointed() = 0;
  // The runtimes checkpoint.load starts from another run's weights (the
  // trained model; a frozen copy of it, such as GRPO's reference).
  virtual std::vector<ModelRuntime*> loadTargets() { return checkpointed(); }
  // Step `step` (0-based) on this rank. Collective.
  virtual StepReport step(int64_t step) = 0;
  // The eval_* metrics of the model as it is now. Collective.
  virtual std::map<std::string, double> evaluate() = 0;
  // Evaluate once before the first step of a fresh run too (step 0), as
  // GRPO reports the starting policy.
  virtual bool evaluatesAtStart() const { return false; }
};

// The engine's training loop over `task`; `unit` names what StepReport::items
// counts ("tokens", "samples").
PTRAIN_API TrainSummary runTrainingLoop(TrainingSession& session, TrainingTask& task, const std::string& unit);

// The engine's training loop over one runtime (Trainer::train's default):
// runTrainingLoop over the trainer's model on the recipe's layout.
PTRAIN_API TrainSummary defaultTrainingLoop(TrainingSession& session, Trainer& trainer);
// The same loop over a runtime made with `options` (session.runtimeOptions()
// changed by the trainer, e.g. a sparse optimizer for its tables).
PTRAIN_API TrainSummary defaultTrainingLoop(TrainingSession& session, Trainer& trainer, const RuntimeOptions& options);

// Trains on this rank. Collective: every rank of the job runs it together.
PTRAIN_API TrainSummary train(PreparedRecipe& prepared, const RankEnv& env, const EngineOptions& options);

}  // namespace ptrain

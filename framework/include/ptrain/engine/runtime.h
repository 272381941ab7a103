// ModelRuntime: one model on one layout of the job's ranks, with its parallel
// plugins, its optimizer and its share of checkpoints, offering a training
// step (micro-batches and a loss function in, a StepResult out) and
// inference.
//
// Building one (collective over the communicator's world):
//   1. the parallel plugins the layout needs are created (parallelPluginsFor:
//      tensor, expert, pipeline, data) from the plugin registry;
//   2. an outline of the model (ModelBuild::outline()) lets them plan which
//      parts this rank builds (the pipeline keeps its stage's blocks);
//   3. torch's generator is seeded with `seed` and the factory builds those
//      parts under nn::DeferredInit: the parameters a plugin may split come
//      without storage (nn/deferred_init.h);
//   4. each parallel plugin's shard() narrows them to this rank's slices
//      (tensor, expert) and records the splits; a split parameter its layer
//      built with storage is refused (ConfigError); then only the slices are
//      allocated and drawn from the model's rule (StagedModel::
//      materialiseParameters): every parameter's values are a pure function
//      of its seed and each element's position, so every layout starts from
//      the single-rank weights and no rank holds a whole split tensor;
//   5. the precision plugin (engine/precision.h) casts the model to its
//      dtype, and each parallel plugin applies itself in order;
//   6. the optimizer takes the parameters this rank holds (none when the
//      model is not trained, e.g. a frozen reference or a rollout copy),
//      with float32 master weights when the precision plugin asks for them
//      (sharded over the data-parallel group under optimizer.distributed);
//   7. with offload.* on, the offload plugin moves what they name to its
//      tier (engine/offload.h).
//
// Step hooks run in this order: the precision plugin, the distributed
// optimizer (optimizer.distributed, which then reduces the gradients over the
// data-parallel groups in place of the data plugin), the parallel plugins
// (tensor, expert, pipeline, data), block recomputation (model.recompute:
// full), the offload plugin, then hooks added with addHooks.
//
// The default training loop (engine.h, train()) drives one runtime. A task
// may drive several on different layouts of the same ranks (an actor, a
// frozen reference and a rollout model), produce batches from one with
// inference and train another on them (TrainingSession, engine.h).
//
// Thread-safety: one thread per rank drives a runtime; every rank of the
// job calls the same runtime methods in the same order (steps, evaluations
// and checkpoints are collective).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

#include "ptrain/engine/batch.h"
#include "ptrain/engine/hooks.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/offload.h"
#include "ptrain/engine/optimizer.h"
#include "ptrain/engine/sharded_checkpoint.h"
#include "ptrain/layout/parallel_layout.h"

namespace ptrain {

class Communicator;
class CrossGroupGradients;
class DeviceGroups;
class DistributedOptimizer;
class ProcessGroup;
class LayoutGroups;
class ParallelPlugin;
class PrecisionPlugin;
class PluginRegistry;
class Plugin;
class Recipe;
struct EvalContext;
class WeightsSource;

// Builds the parts of the model that `build` names (Trainer::buildModel).
using ModelFactory = std::function<std::shared_ptr<StagedModel>(const ModelBuild& build)>;
// The loss of one micro-batch from the head's input (the last stage's
// hidden states). The default is StagedModel::head.
using LossFunction = std::function<LossOutput(StagedModel& model, const at::Tensor& hidden, const Batch& micro)>;

struct RuntimeOptions {
  std::string name = "model";  // in logs; prefixes its checkpoint files unless it is "model"
  ParallelLayout layout{LayoutSizes{}};  // over the communicator's world
  at::Device device{at::kCPU};
  uint64_t seed = 0;           // torch's generator is seeded with it before the model is built
  std::string precision = "fp32";  // the precision plugin (precision.name)
  // model.recompute: "full" recomputes whole blocks (the first
  // recompute_num_layers of those this rank runs; 0: all) in backward;
  // "selective" and "none" need nothing of the runtime (selective is the
  // model's own, nn/recompute.h).
  std::string recompute = "none";
  int64_t recompute_num_layers = 0;
  // offload.*: when any is on, the offload plugin (offload/tiered) keeps
  // them in its tier (engine/offload.h).
  OffloadSettings offload;
  // parallel.data_parallel_shares: each data-parallel rank's weight in the
  // split of a global batch (microBatches()); empty: an even split.
  std::vector<double> data_parallel_shares;
  // train.max_memory_mb: after every step, a peak resident set above it
  // throws OutOfMemoryError; 0: no cap.
  double max_memory_mb = 0;
  // Options the parallel plugins read (parallel.*); null: their defaults.
  const Recipe* recipe = nullptr;
  // The optimizer; nullopt: the model is not trained (step() refuses).
  std::optional<OptimizerOptions> optimizer;
  // parallel.groups (layout/device_groups.h): this runtime is device group
  // `group` of `groups`, built on the group's own communicator
  // (Communicator::part) with the group's layout; `job` is the world of every
  // group. The groups' gradients are summed over the job
  // (engine/cross_group_gradients.h), the loss and sumOverDataParallel add up
  // over every group, dataRows() is the group's rows of the global batch, the
  // gradient norm is group 0's (the same gradient everywhere) and only group
  // 0 writes checkpoints. Nullopt: the communicator's world is the job.
  struct DeviceGroupRun {
    std::shared_ptr<const DeviceGroups> groups;
    int group = 0;
    std::shared_ptr<ProcessGroup> job;
  };
  std::optional<DeviceGroupRun> device_groups;
};

// One training step's input.
struct StepInput {
  int64_t step = 0;  // 0-based index of the step (dropout streams under a pipeline, hooks)
  // This data-parallel rank's micro-batches, equal in shape (microBatches()).
  std::vector<Batch> micro_batches;
  // Items the loss is averaged over in the whole global batch (e.g. answer
  // tokens over every data-parallel rank): backward runs on loss_sum /
  // loss_divisor, so every split of the batch yields the single-rank gradient.
  double loss_divisor = 1;
  LossFunction loss;  // empty: the model's head
};

class PTRAIN_API ModelRuntime {
 public:
  // Builds the model and distributes it (see above). `registry` must outlive
  // the runtime (it keeps the plugin libraries loaded). Throws ConfigError
  // for a model that cannot take the layout (e.g. heads not divisible by tp),
  // PluginLoadError for a missing plugin.
  ModelRuntime(Communicator& comm, PluginRegistry& registry, const ModelFactory& factory, RuntimeOptions options);
  ~ModelRuntime();
  ModelRuntime(const ModelRuntime&) = delete;
  ModelRuntime& operator=(const ModelRuntime&) = delete;

  const std::string& name() const { return options_.name; }
  // The model, its parameters holding the last step's values (under
  // optimizer.distributed, once the all-gathers still in flight are done).
  StagedModel& model();
  std::shared_ptr<StagedModel> sharedModel();
  const LayoutGroups& groups() const { return *groups_; }
  const ParallelLayout& layout() const { return options_.layout; }
  at::Device device() const { return options_.device; }
  // Null when the model is not trained.
  // Under optimizer.distributed: the optimizer of this rank's ranges
  // (engine/distributed_optimizer.h).
  Optimizer* optimizer() { return optimizer_; }
  const std::vector<ParallelPlugin*>& parallelPlugins() const { return parallel_; }
  PrecisionPlugin& precision() { return *precision_; }

  // Adds hooks after the parallel plugins (precision, offload, a test's).
  // Before the first step.
  void addHooks(std::shared_ptr<StepHooks> hooks);

  // The rows [begin, end) of a global batch of `rows` rows that this
  // data-parallel rank consumes: an even slice, or its
  // parallel.data_parallel_shares weight of the rows. Throws ConfigError when
  // the rows do not split.
  std::pair<int64_t, int64_t> dataRows(int64_t rows) const;
  // This rank's rows (dataRows of a global batch) cut into micro-batches of
  // `microBatchSize` rows (0: one micro-batch), moved to the device. Throws
  // ConfigError when they do not split evenly.
  std::vector<Batch> cutMicroBatches(const Batch& rows, int64_t microBatchSize) const;
  // The same from the whole global batch: this rank's slice, cut.
  std::vector<Batch> microBatches(const Batch& globalBatch, int64_t microBatchSize) const;
  // Each value summed over the data-parallel group (every rank of it passes
  // its rows' figures): counts of the whole global batch from each rank's
  // rows. Collective over the data-parallel group.
  std::vector<double> sumOverDataParallel(const std::vector<double>& values) const;
  // The rows of a global batch of `rows` rows that every data-parallel rank
  // computed its own block of (`mine`: its dataRows, [end - begin, ...]),
  // assembled in order on every rank, on the device: each block comes from
  // one replica and is added to zeros, so the values are exactly the ones
  // computed (under parallel.groups: every group's blocks, over the job).
  // Collective over the data-parallel group (the job under device groups).
  at::Tensor assembleRows(const at::Tensor& mine, int64_t rows) const;

  // One training step: forward and backward over the micro-batches, the
  // hooks' gradient work, clipping, and (unless a hook vetoes it) the
  // optimizer step. Collective over the world. The first step's stats carry
  // this rank's memory: mem_params, mem_grads, mem_optimizer (bytes of the
  // tensors it holds; optimizer: moments and float32 masters) and, on the
  // host with the caching allocator and without a pipeline schedule,
  // mem_activations (bytes the first micro-batch's forward pass keeps for
  // backward).
  StepResult step(const StepInput& input);

  // For a trainer's evaluation: this rank's data-parallel shard, a sum over
  // the data-parallel group, the device.
  EvalContext evalContext() const;
  // Runs `fn` with the model in eval mode and no gradient, then back to
  // train mode. Collective when `fn` is.
  void inference(const std::function<void(StagedModel& model, const EvalContext& ctx)>& fn);

  // Checkpoints (engine/sharded_checkpoint.h). No communication in either.
  //
  // What this rank writes of this runtime, each tensor once in the job, with
  // the block of the whole tensor it is: the parameters it owns (held, not a
  // mirror, and the first rank along every axis the parameter is replicated
  // over: Placement::countedInNorm), their optimizer state (slots, and
  // "master.<param>" for parameters that are not float32; under
  // optimizer.distributed this rank's ranges, as flat blocks), and on the
  // world's rank 0 the precision plugin's state ("precision.<name>").
  RankShare checkpointShare();
  // Reads this rank's blocks of a checkpoint written at any layout and any
  // precision (sharded, or whole tensors of an earlier ptrain) from the
  // tensors `reader` holds for runtime `source`: every parameter this rank
  // holds (a float32 one from "master.<param>" where the checkpoint kept
  // float32 masters of lower-precision parameters), and with `withOptimizer`
  // the optimizer state (masters from "master.<param>", else from the saved
  // parameter: a float32 checkpoint), its applied-step count
  // `optimizerSteps` and the precision plugin's state. Throws CheckpointError
  // naming the folder when a tensor is missing or has another shape (a
  // checkpoint of another model), or what the reader throws.
  void loadCheckpoint(CheckpointReader& reader, const std::string& source, bool withOptimizer,
                      int64_t optimizerSteps = 0);
  // Reads this rank's block of every parameter it holds from `weights`
  // (checkpoint.load: another run's step folder, a safetensors state dict, a
  // trainer's adapter of another framework's folder), converted to the
  // parameter's dtype; optimizer and precision state are left as they are.
  // Throws CheckpointError naming weights.where() when a parameter is
  // missing or has another shape.
  void loadWeights(WeightsSource& weights);
  // Parameters the whole model has (held and not a mirror, summed over the
  // pipeline stages), to tell a checkpoint of another model: collective over
  // the pipeline group.
  int64_t ownedParameterCount();

 private:
  at::Tensor runBlock(int index, const at::Tensor& input);
  // Waits for the distributed optimizer's all-gathers of the last step
  // (they overlap the next forward pass): before anything outside a step
  // reads or writes the parameters.
  void awaitParameters();
  LossOutput runLoss(const StepInput& input, const at::Tensor& hidden, const Batch& micro);
  // The first step's mem_* figures (see step()).
  void reportMemory(StepResult& result, int64_t activationBytes);

  Communicator& comm_;
  RuntimeOptions options_;
  std::shared_ptr<const LayoutGroups> groups_;
  std::vector<std::unique_ptr<Plugin>> pluginObjects_;
  std::vector<ParallelPlugin*> parallel_;
  PrecisionPlugin* precision_ = nullptr;  // owned by pluginObjects_
  std::vector<std::shared_ptr<StepHooks>> extraHooks_;
  std::vector<StepHooks*> hooks_;  // parallel plugins, then the extra hooks
  bool observeBlocks_ = false;
  // Per block: what runs when backward reaches its output, and its input.
  std::vector<std::pair<std::function<void()>, std::function<void()>>> blockEvents_;
  std::shared_ptr<StagedModel> model_;
  std::unique_ptr<Optimizer> ownOptimizer_;
  std::shared_ptr<DistributedOptimizer> distributed_;  // optimizer.distributed
  std::shared_ptr<CrossGroupGradients> crossGroup_;    // parallel.groups
  Optimizer* optimizer_ = nullptr;  // ownOptimizer_, or distributed_'s local optimizer
  std::vector<bool> countedInNorm_;  // per optimizer parameter
  bool memoryReported_ = false;
};

}  // namespace ptrain

// ParallelPlugin: the interface of a `parallel` plugin (data, tensor,
// pipeline, expert). A ModelRuntime creates the plugins its layout needs
// (parallelPluginsFor, engine/parallel_plugins.h) in a fixed order (tensor,
// expert, pipeline, data), lets each plan which parts of the model this rank
// builds, applies them to the built model in that order, then calls their
// step hooks (engine/hooks.h) around every training step.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "ptrain/engine/hooks.h"
#include "ptrain/plugin/plugin.h"

namespace ptrain {

class LayoutGroups;
class StagedModel;
struct Batch;
struct LossOutput;
struct ModelBuild;

// One step's forward and backward passes, as the runtime hands them to a
// plugin that schedules them itself (the pipeline).
struct PTRAIN_API MicroBatchRun {
  StagedModel* model = nullptr;
  const std::vector<Batch>* micro_batches = nullptr;  // this data-parallel rank's, in order
  // Block `index` through every hook's runBlock: use it instead of
  // StagedModel::runBlock.
  std::function<at::Tensor(int index, const at::Tensor& input)> run_block;
  // The step's loss on the head's input (last stage only).
  std::function<LossOutput(const at::Tensor& hidden, const Batch& micro)> loss;
  // Backward starts from loss_sum * loss_scale / loss_divisor: the divisor
  // (items in the global batch) makes every split of the batch yield the
  // single-rank gradient; the scale is the fp16 loss scale (1 otherwise).
  double loss_divisor = 1;
  double loss_scale = 1;
  // Call before each backward pass: index = backward passes run before it
  // this step, count = backward passes this step. Runs every hook's
  // beforeBackward.
  std::function<void(int index, int count)> before_backward;

  // What backward starts from for a micro-batch's loss_sum.
  at::Tensor backwardLoss(const at::Tensor& lossSum) const;
};

class PTRAIN_API ParallelPlugin : public Plugin, public StepHooks {
 public:
  ~ParallelPlugin() override;
  const char* kind() const final { return plugin_kind::kParallel; }

  // Before the model exists: narrow `build` to the parts this rank needs.
  // `outline` is the model built from ModelBuild::outline() (no parameters;
  // numBlocks, prefixes and blockCost answer). Default: leaves it.
  virtual void planBuild(StagedModel& outline, const LayoutGroups& groups, ModelBuild& build) {}
  // Before any parameter has storage: narrows the parameters this plugin
  // splits to this rank's slice and records the splits in model.placement.
  // The runtime builds the model under nn::DeferredInit, so the parameters a
  // plugin may split are deferred (nn/deferred_init.h): narrow them with
  // nn::narrowParameter, which allocates nothing; after every plugin's shard
  // the runtime allocates each slice and draws it from the model's rule
  // (StagedModel::materialiseParameters), so no rank holds a whole tensor of
  // a split parameter. Called once per plugin, in order, right after the
  // build. Default: splits nothing.
  virtual void shard(StagedModel& model, const LayoutGroups& groups) {}
  // Distributes `model` over this rank's groups of the runtime's layout:
  // hands layers their groups, records what else the placement needs,
  // registers gradient hooks. Called once, after every plugin's shard, the
  // parameters' allocation and the precision plugin's cast, after the
  // earlier plugins' apply and before the optimizer sees the parameters.
  virtual void apply(StagedModel& model, const LayoutGroups& groups) = 0;
  // A plugin that orders the forward and backward passes itself (the
  // pipeline) runs them here and returns the sum of the loss_sum values it
  // computed (0 on ranks that compute no loss). Others return nullopt, and
  // the runtime runs the micro-batches one after another.
  virtual std::optional<double> runMicroBatches(const MicroBatchRun& run) { return std::nullopt; }
};

}  // namespace ptrain

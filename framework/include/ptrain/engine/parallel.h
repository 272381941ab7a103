// ParallelPlugin: the interface of a `parallel` plugin (data, tensor,
// pipeline, expert). The engine applies them in a fixed order (tensor, expert,
// pipeline, data) and calls the hooks below around every training step.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/plugin/plugin.h"

namespace ptrain {

class Communicator;
class StagedModel;
struct Batch;

// One step's forward and backward passes, as the engine hands them to a
// plugin that schedules them itself.
struct MicroBatchRun {
  StagedModel* model = nullptr;
  const std::vector<Batch>* micro_batches = nullptr;  // this data-parallel rank's, in order
  double loss_scale = 1;  // every micro-batch's loss_sum is multiplied by it before backward
  // Call before each backward pass: index = backward passes run before it
  // this step, count = backward passes this step. Runs every parallel
  // plugin's beforeBackward.
  std::function<void(int index, int count)> before_backward;
};

class PTRAIN_API ParallelPlugin : public Plugin {
 public:
  ~ParallelPlugin() override;
  const char* kind() const final { return plugin_kind::kParallel; }

  // Distributes `model` over this rank's groups: shards parameters, registers
  // gradient hooks. Called once, before the optimizer sees the parameters.
  virtual void apply(StagedModel& model, Communicator& comm) = 0;
  // Called at the start of every step, before any forward pass.
  virtual void beginStep() {}
  // A plugin that orders the forward and backward passes itself (the
  // pipeline) runs them here and returns the sum of the loss_sum values it
  // computed (0 on ranks that compute no loss). Others return nullopt, and
  // the engine runs the micro-batches one after another.
  virtual std::optional<double> runMicroBatches(const MicroBatchRun& run) { return std::nullopt; }
  // Called before the backward pass of micro-batch `index` of `count`.
  virtual void beforeBackward(int index, int count) {}
  // Called after the last backward pass of a step, in reverse order of
  // application (data first): every gradient this plugin is responsible for
  // must be final when it returns.
  virtual void finishGradients() {}
  // Figures of the last step (e.g. "dp_comm_bytes"), merged into the metrics.
  virtual std::map<std::string, double> stepStats() const { return {}; }
};

}  // namespace ptrain

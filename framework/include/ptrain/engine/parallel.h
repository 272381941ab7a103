// ParallelPlugin: the interface of a `parallel` plugin (data, tensor,
// pipeline, expert). The engine applies them in a fixed order (tensor, expert,
// pipeline, data) and calls the hooks below around every training step.
#pragma once

#include <map>
#include <string>

#include "ptrain/plugin/plugin.h"

namespace ptrain {

class Communicator;
class StagedModel;

class PTRAIN_API ParallelPlugin : public Plugin {
 public:
  ~ParallelPlugin() override;
  const char* kind() const final { return plugin_kind::kParallel; }

  // Distributes `model` over this rank's groups: shards parameters, registers
  // gradient hooks. Called once, before the optimizer sees the parameters.
  virtual void apply(StagedModel& model, Communicator& comm) = 0;
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

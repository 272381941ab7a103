// Saves and restores training state under RUN_DIR/checkpoints/step_N/:
// model.safetensors (unsharded parameters by name), optimizer.safetensors
// (AdamW moments), meta.json (step, RNG state, data position, recipe, layout,
// parameter shapes). Written atomically by rank 0.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

namespace ptrain {

class Optimizer;
class ProcessGroup;
class Recipe;
class StagedModel;

class Checkpointer {
 public:
  // `tensorGroup`: the group sharded parameters are gathered over (and
  // resharded for) — checkpoints always hold full tensors.
  Checkpointer(std::string runDir, const Recipe& recipe, std::string layout,
               std::shared_ptr<ProcessGroup> tensorGroup);

  // Collective over `world`: every rank gathers its shards, `writer` writes,
  // everyone waits until it is done.
  void save(int64_t step, StagedModel& model, const Optimizer& optimizer, bool writer, ProcessGroup& world);
  // Loads the newest checkpoint into model and optimizer, restores the RNG
  // state; returns its step. Throws CheckpointError when there is none, or
  // it is corrupt or from another model.
  int64_t restoreLatest(StagedModel& model, Optimizer& optimizer);

 private:
  std::string runDir_;
  const Recipe& recipe_;
  std::string layout_;
  std::shared_ptr<ProcessGroup> tensorGroup_;
};

}  // namespace ptrain

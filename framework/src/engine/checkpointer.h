// Saves and restores training state under RUN_DIR/checkpoints/step_N/:
// model.safetensors (unsharded parameters by name), optimizer.safetensors
// (AdamW moments), meta.json (step, RNG state, data position, recipe, layout,
// parameter shapes). Written atomically by rank 0, after every tensor-parallel
// shard is gathered and every pipeline stage has sent its tensors to it.
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
  // resharded for); `pipelineGroup`: the stages whose parameters are brought
  // to the writer (stage 0) when `inWriterPipeline` (this rank's pipeline
  // holds the writer). Checkpoints always hold full tensors of the whole
  // model, so they load into any layout.
  Checkpointer(std::string runDir, const Recipe& recipe, std::string layout,
               std::shared_ptr<ProcessGroup> tensorGroup, std::shared_ptr<ProcessGroup> pipelineGroup,
               bool inWriterPipeline);

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
  std::shared_ptr<ProcessGroup> pipelineGroup_;
  bool inWriterPipeline_ = true;
};

}  // namespace ptrain

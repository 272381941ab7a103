// Checkpoint folders of a training session: RUN_DIR/checkpoints/step_N/
// holds, for every runtime, its parameters and optimizer state full-size
// (ModelRuntime::checkpointFile: model.safetensors and optimizer.safetensors
// for the runtime named "model") and meta.json (step, RNG state, data
// position, recipe, and per runtime its layout, applied optimizer steps and
// parameter shapes). Written atomically by the world's rank 0 after every
// runtime has gathered its shards there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ptrain {

class ModelRuntime;
class ProcessGroup;
class Recipe;

// Collective over `world`: every runtime gathers, rank 0 writes, everyone
// waits until it is done. `extra` is merged into meta.json.
void saveCheckpoint(const std::string& runDir, int64_t step, const std::vector<ModelRuntime*>& runtimes,
                    const Recipe& recipe, const nlohmann::json& extra, ProcessGroup& world);

// Loads the newest checkpoint into every runtime and restores the RNG state;
// returns its step. Throws CheckpointError when there is none, or it is
// corrupt or from other models. Collective over the world.
int64_t restoreLatestCheckpoint(const std::string& runDir, const std::vector<ModelRuntime*>& runtimes);
// Loads the parameters of the newest checkpoint of another run (`runDir`)
// into every runtime, leaving optimizers and RNG as they are: a run that
// starts from an earlier one's weights (the GRPO actor from its supervised
// run). `runDir` is a run folder, or runs/NAME (`ptrain run` without
// --run-dir makes one timestamped folder per run there), whose newest run
// with a checkpoint is taken. The weights are those of the checkpoint's
// first model file among
// `files` ("model.safetensors", "actor.model.safetensors"). Returns the
// checkpoint's step. Throws CheckpointError naming the folder when there is
// no checkpoint, none of the files, or weights of another model. Collective
// over the world.
int64_t loadWeightsFromRun(const std::string& runDir, const std::vector<std::string>& files,
                           const std::vector<ModelRuntime*>& runtimes);

}  // namespace ptrain

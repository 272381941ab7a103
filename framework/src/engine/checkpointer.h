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

}  // namespace ptrain

// Checkpoint folders of a training session: RUN_DIR/checkpoints/step_N/
// holds every runtime's tensors in shards, each rank writing what it owns
// (engine/sharded_checkpoint.h: <runtime>.rank<R>.safetensors and
// index.json), and meta.json (step, RNG state, data position, recipe, and per
// runtime its layout, applied optimizer steps and parameter shapes). The
// world's rank 0 makes the hidden folder, writes index.json and meta.json and
// renames the folder into place once every rank has written (checkpoint_io.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ptrain {

class CheckpointReader;
class ModelRuntime;
class WeightsSource;
class ProcessGroup;
class Recipe;

// What one save or load cost this rank.
struct CheckpointIo {
  double seconds = 0;
  uint64_t bytes = 0;  // written, or read
};

// Collective over `world`: every rank writes its share, rank 0 the index and
// meta.json, then the folder becomes step_<step>. `extra` is merged into
// meta.json. Throws CheckpointError on every rank when any rank failed; the
// previous checkpoints stay as they were.
CheckpointIo saveCheckpoint(const std::string& runDir, int64_t step, const std::vector<ModelRuntime*>& runtimes,
                            const Recipe& recipe, const nlohmann::json& extra, ProcessGroup& world);

// Loads the newest checkpoint (sharded, or whole tensors of an earlier
// ptrain) into every runtime, each rank reading only its blocks, and restores
// the RNG state; its step goes to *step. Throws CheckpointError on every rank
// when there is none, it is damaged, its meta.json names another step than
// its folder, or it holds another model. Collective over the world.
CheckpointIo restoreLatestCheckpoint(const std::string& runDir, const std::vector<ModelRuntime*>& runtimes,
                                     ProcessGroup& world, int64_t* step);
// Loads the parameters of the newest checkpoint of another run (`runDir`)
// into every runtime, leaving optimizers and RNG as they are: a run that
// starts from an earlier one's weights (the GRPO actor from its supervised
// run). `runDir` is a run folder, or runs/NAME (`ptrain run` without
// --run-dir makes one timestamped folder per run there), whose newest run
// with a checkpoint is taken. The weights are those of the first of
// `sources` (runtime names: "model", "actor") the checkpoint holds. Returns
// the checkpoint's step. Throws CheckpointError naming the folder when there
// is no checkpoint, none of the sources, or weights of another model.
// Collective over the world.
// `path` may also be a safetensors file (a state dict with the model's
// names; step -1) or a folder `foreign` (the trainer's
// openForeignWeights) reads (step -1).
using ForeignWeightsOpener = std::function<std::unique_ptr<WeightsSource>(const std::string& path)>;
int64_t loadWeightsFromRun(const std::string& runDir, const std::vector<std::string>& sources,
                           const std::vector<ModelRuntime*>& runtimes, ProcessGroup& world,
                           const ForeignWeightsOpener& foreign = {});
// What loadWeightsFromRun reads, opened on this process alone (`ptrain
// export`, the checks): the source, the step folder's reader it borrows
// (kept in *reader) and the step (-1 for a file or a foreign folder). Throws
// CheckpointError (one line) for a path that holds none of these.
std::unique_ptr<WeightsSource> openWeights(const std::string& path, const std::vector<std::string>& sources,
                                           const ForeignWeightsOpener& foreign,
                                           std::unique_ptr<CheckpointReader>* reader, int64_t* step);

}  // namespace ptrain

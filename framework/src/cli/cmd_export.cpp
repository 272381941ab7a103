// ptrain export: a checkpoint in another framework's format (the llm
// trainer's GPT as a Hugging Face GPT-2 folder). The run's own recipe
// (RUN_DIR/recipe.yaml) sets the trainer up, so the export knows the model
// exactly as it trained; the trainer writes the format.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/engine/engine.h"
#include "ptrain/engine/sharded_checkpoint.h"
#include "ptrain/engine/trainer.h"
#include "ptrain/engine/weights_source.h"

namespace fs = std::filesystem;

namespace ptrain::cli {

namespace {

// The world size a checkpoint's run had ("world=4 tp=2 ..." in meta.json).
int worldOf(const nlohmann::json& meta) {
  const std::string layout = meta.value("layout", "");
  const size_t at = layout.find("world=");
  return at == std::string::npos ? 0 : std::atoi(layout.c_str() + at + 6);
}

}  // namespace

int cmdExport(const std::string& from, const std::string& format, const std::string& outDir) {
  int64_t step = 0;
  const std::string dir = resolveWeightsSource(from, &step);
  const nlohmann::json meta = readJsonFile((fs::path(dir) / "meta.json").string());
  // The recipe as the run wrote it (RUN_DIR/recipe.yaml, what --resume reads
  // too), two folders above the step's.
  const fs::path recipePath = fs::path(dir).parent_path().parent_path() / "recipe.yaml";
  if (!fs::is_regular_file(recipePath)) {
    throw CheckpointError(recipePath.string() + ": not found; the export reads the run's recipe to know its model: "
                                                "give a step folder inside its run folder, RUN_DIR/checkpoints/step_N");
  }
  PreparedRecipe prepared = prepareRecipe(recipePath.string(), {}, worldOf(meta), 0);
  CheckpointReader reader(dir);
  const char* runtime = reader.hasRuntime("model") ? "model" : "actor";
  if (!reader.hasRuntime(runtime)) throw CheckpointError(dir + ": holds no model weights to export");
  auto weights = checkpointWeights(reader, runtime);
  prepared.trainer->exportWeights(format, *weights, outDir);
  std::printf("%s: %s weights of %s (step %lld)\n", outDir.c_str(), format.c_str(), dir.c_str(),
              static_cast<long long>(step));
  return 0;
}

}  // namespace ptrain::cli

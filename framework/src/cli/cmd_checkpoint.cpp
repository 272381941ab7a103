// ptrain checkpoint consolidate: a sharded checkpoint as whole-tensor files.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/engine/sharded_checkpoint.h"

namespace fs = std::filesystem;

namespace ptrain::cli {

int cmdCheckpointConsolidate(const std::string& stepDir, const std::string& outDir) {
  if (!fs::is_directory(stepDir)) {
    throw CheckpointError(stepDir + ": not a folder: give a checkpoint folder, RUN_DIR/checkpoints/step_N");
  }
  std::error_code ec;
  if (fs::exists(outDir, ec) && fs::equivalent(stepDir, outDir, ec)) {
    throw ConfigError(outDir + ": the output folder is the checkpoint itself; choose another");
  }
  consolidateCheckpoint(stepDir, outDir);
  uintmax_t bytes = 0;
  int files = 0;
  for (const auto& entry : fs::directory_iterator(outDir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") {
      bytes += entry.file_size();
      ++files;
    }
  }
  std::printf("%s: %d safetensors files, %.1f MB, and meta.json, from %s\n", outDir.c_str(), files,
              static_cast<double>(bytes) / 1e6, stepDir.c_str());
  return 0;
}

}  // namespace ptrain::cli

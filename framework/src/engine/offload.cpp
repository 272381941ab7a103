#include "ptrain/engine/offload.h"

#include <unistd.h>

#include <filesystem>

#include "ptrain/core/device.h"
#include "ptrain/recipe/recipe.h"

namespace fs = std::filesystem;

namespace ptrain {

OffloadPlugin::~OffloadPlugin() = default;

OffloadSettings OffloadSettings::fromRecipe(const Recipe& recipe, const std::string& runDir) {
  OffloadSettings s;
  s.params = recipe.getBool("offload.params");
  s.grads = recipe.getBool("offload.grads");
  s.optimizer = recipe.getBool("offload.optimizer");
  s.plugin = recipe.getString("offload.name");
  // offload/tiered's key; another offload plugin reads its own.
  if (recipe.has("offload.tier")) s.tier = recipe.getString("offload.tier");
  s.folder = (fs::path(runDir) / "offload").string();
  return s;
}

namespace {

// The first key of the section that is on, for the location of a problem.
std::string firstKeyOn(const Recipe& recipe) {
  for (const char* key : {"offload.params", "offload.grads", "offload.optimizer"})
    if (recipe.getBool(key)) return key;
  return "offload.params";
}

// The folder itself when it exists, else its nearest existing parent: where
// the run would create it.
fs::path existingAncestor(fs::path p) {
  std::error_code ec;
  p = fs::absolute(p, ec);
  while (!p.empty() && !fs::exists(p, ec)) {
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  return p;
}

// Where the model computes decides the tier.
bool computesOnCuda(const Recipe& recipe) {
  const std::string device = recipe.getString("device.type");
  return device == "cuda" || (device == "auto" && cudaDeviceCount() > 0);
}

}  // namespace

std::vector<std::string> checkOffload(const Recipe& recipe) {
  std::vector<std::string> problems;
  if (!OffloadSettings::fromRecipe(recipe, "").any()) return problems;
  const std::string key = firstKeyOn(recipe);
  const std::string where = recipe.location(key).str() + ": ";
  const std::string tier = recipe.has("offload.tier") ? recipe.getString("offload.tier") : "auto";
  const bool cuda = computesOnCuda(recipe);
  if (cuda && tier == "disk") {
    problems.push_back(recipe.location("offload.tier").str() +
                       ": offload.tier=disk serves the cpu device; on cuda tensors rest in pinned host memory: set "
                       "offload.tier to auto or pinned, or run with device: cpu");
  } else if (!cuda && tier == "pinned") {
    problems.push_back(recipe.location("offload.tier").str() +
                       ": offload.tier=pinned serves the cuda device (pinned host memory the GPU copies from); on "
                       "cpu tensors rest on disk: set offload.tier to auto or disk, or run with device: cuda");
  }
  if (recipe.getBool("optimizer.distributed")) {
    problems.push_back(where + key +
                       "=true with optimizer.distributed=true: offload moves the whole optimizer's tensors, the "
                       "distributed optimizer keeps its own ranges; use one of the two");
  }
  return problems;
}

std::vector<std::string> offloadWarnings(const Recipe& recipe) {
  std::vector<std::string> warnings;
  if (!recipe.getBool("offload.params") || !computesOnCuda(recipe)) return warnings;
  const std::string mode = recipe.has("model.recompute") ? recipe.getString("model.recompute") : "none";
  if (mode != "full") {
    warnings.push_back(recipe.location("offload.params").str() +
                       ": offload.params=true on cuda with model.recompute=" + mode +
                       ": autograd keeps each block's weights on the device from its forward to its backward, so "
                       "parameter offload saves little device memory (a 1.2B GPT: 30.8 GB with it, 30.4 GB "
                       "without); set model.recompute: full, which brings each block's weights in for its backward "
                       "only");
  }
  return warnings;
}

std::vector<std::string> checkOffloadFolder(const Recipe& recipe, const std::string& runDir) {
  std::vector<std::string> problems;
  // The pinned host tier (cuda) writes no files.
  if (!OffloadSettings::fromRecipe(recipe, runDir).any() || computesOnCuda(recipe)) return problems;
  const std::string key = firstKeyOn(recipe);
  const std::string where = recipe.location(key).str() + ": ";
  const fs::path folder = runDir.empty() ? fs::path("runs") / recipe.name() : fs::path(runDir);
  const fs::path existing = existingAncestor(folder);
  std::error_code ec;
  if (existing.empty() || !fs::is_directory(existing, ec) || ::access(existing.c_str(), W_OK | X_OK) != 0) {
    problems.push_back(where + "offload's disk tier writes its files under the run folder, and " +
                       (existing.empty() ? folder.string() : existing.string()) +
                       " is not writable; choose a writable --run-dir, or set offload." +
                       key.substr(key.find('.') + 1) + " to false");
  }
  return problems;
}

}  // namespace ptrain

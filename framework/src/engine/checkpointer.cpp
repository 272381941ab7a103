#include "engine/checkpointer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "ptrain/comm/process_group.h"
#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/engine/runtime.h"
#include "ptrain/engine/safetensors.h"
#include "ptrain/recipe/recipe.h"

namespace fs = std::filesystem;

namespace ptrain {
namespace {

std::string toHex(const at::Tensor& bytes) {
  static const char* digits = "0123456789abcdef";
  auto t = bytes.contiguous();
  const auto* data = t.data_ptr<uint8_t>();
  std::string out;
  out.reserve(static_cast<size_t>(t.numel()) * 2);
  for (int64_t i = 0; i < t.numel(); ++i) {
    out.push_back(digits[data[i] >> 4]);
    out.push_back(digits[data[i] & 15]);
  }
  return out;
}

at::Tensor fromHex(const std::string& hex, const std::string& where) {
  if (hex.size() % 2 != 0) throw CheckpointError(where + ": corrupt RNG state");
  auto t = torch::empty({static_cast<int64_t>(hex.size() / 2)}, torch::kUInt8);
  auto* data = t.data_ptr<uint8_t>();
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw CheckpointError(where + ": corrupt RNG state");
  };
  for (size_t i = 0; i < hex.size() / 2; ++i) data[i] = static_cast<uint8_t>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  return t;
}

}  // namespace

void saveCheckpoint(const std::string& runDir, int64_t step, const std::vector<ModelRuntime*>& runtimes,
                    const Recipe& recipe, const nlohmann::json& extra, ProcessGroup& world) {
  std::vector<ModelRuntime::Tensors> shares;
  for (ModelRuntime* runtime : runtimes) shares.push_back(runtime->gatherForCheckpoint());
  if (world.rank() == 0) {
    nlohmann::json perRuntime = nlohmann::json::object();
    for (size_t i = 0; i < runtimes.size(); ++i) {
      nlohmann::json shapes = nlohmann::json::object();
      for (const auto& [name, t] : shares[i].parameters) shapes[name] = t.sizes().vec();
      Optimizer* optimizer = runtimes[i]->optimizer();
      perRuntime[runtimes[i]->name()] = {{"layout", runtimes[i]->layout().describe()},
                                         {"optimizer_step", optimizer ? optimizer->stepCount() : 0},
                                         {"parameters", shapes}};
    }
    nlohmann::json meta{
        {"step", step},
        {"data_position", step},  // index of the next global batch
        {"rng", {{"torch_cpu", toHex(at::detail::getDefaultCPUGenerator().get_state())}}},
        {"recipe", recipe.toYaml()},
        {"runtimes", perRuntime},
    };
    // The first runtime's figures at the top level too, where readers of a
    // single-model checkpoint look for them.
    if (!runtimes.empty()) {
      const auto& first = perRuntime[runtimes.front()->name()];
      meta["optimizer_step"] = first["optimizer_step"];
      meta["layout"] = first["layout"];
      meta["parameters"] = first["parameters"];
    }
    for (const auto& [key, value] : extra.items()) meta[key] = value;
    writeCheckpointAtomically(runDir, step, [&](const std::string& dir) {
      for (size_t i = 0; i < runtimes.size(); ++i) {
        saveSafetensors((fs::path(dir) / runtimes[i]->checkpointFile(false)).string(), shares[i].parameters,
                        {{"format", "pt"}});
        saveSafetensors((fs::path(dir) / runtimes[i]->checkpointFile(true)).string(), shares[i].optimizer,
                        {{"format", "pt"}});
      }
      writeJsonFile((fs::path(dir) / "meta.json").string(), meta);
    });
    pruneCheckpoints(runDir, static_cast<int>(recipe.getInt("checkpoint.keep")), step);
  }
  // Nobody runs ahead of a checkpoint that is still being written.
  world.barrier()->wait();
}

int64_t restoreLatestCheckpoint(const std::string& runDir, const std::vector<ModelRuntime*>& runtimes) {
  if (!fs::is_directory(runDir)) {
    throw CheckpointError(runDir + ": run folder not found: --resume needs the --run-dir of an earlier run");
  }
  auto latest = latestCheckpoint(runDir);
  if (!latest) {
    throw CheckpointError(runDir + ": no checkpoint to resume from (" + (fs::path(runDir) / "checkpoints").string() +
                          " holds no complete step_N folder)");
  }
  const std::string dir = checkpointDir(runDir, *latest);
  auto meta = readJsonFile((fs::path(dir) / "meta.json").string());
  try {
    for (ModelRuntime* runtime : runtimes) {
      const std::string weightsFile = (fs::path(dir) / runtime->checkpointFile(false)).string();
      if (!fs::exists(weightsFile)) {
        throw CheckpointError(detail::concat(dir, ": no ", runtime->checkpointFile(false), " for model '",
                                             runtime->name(), "': the checkpoint is from another run"));
      }
      auto weights = loadSafetensors(weightsFile);
      std::map<std::string, at::Tensor> state;
      if (runtime->optimizer() != nullptr) {
        state = loadSafetensors((fs::path(dir) / runtime->checkpointFile(true)).string()).tensors;
      }
      int64_t optimizerSteps = meta.value("optimizer_step", int64_t{0});
      if (meta.contains("runtimes") && meta["runtimes"].contains(runtime->name())) {
        optimizerSteps = meta["runtimes"][runtime->name()].at("optimizer_step").get<int64_t>();
      }
      runtime->loadCheckpoint(weights.tensors, state, optimizerSteps, dir);
    }
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(fromHex(meta.at("rng").at("torch_cpu").get<std::string>(), dir + "/meta.json"));
    return meta.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(detail::concat(dir, "/meta.json: ", e.what()));
  }
}

int64_t loadWeightsFromRun(const std::string& path, const std::vector<std::string>& files,
                           const std::vector<ModelRuntime*>& runtimes) {
  if (!fs::is_directory(path)) {
    throw CheckpointError(path + ": run folder not found: give the folder of a finished run (its --run-dir), or "
                          "runs/NAME for the newest run of recipe NAME");
  }
  // runs/NAME (what `ptrain run` fills with one timestamped folder per run
  // when no --run-dir is given): its newest run that holds a checkpoint.
  std::string runDir = path;
  if (!fs::exists(fs::path(path) / "checkpoints")) {
    std::vector<std::string> runs;
    for (const auto& entry : fs::directory_iterator(path)) {
      if (entry.is_directory() && latestCheckpoint(entry.path().string())) runs.push_back(entry.path().string());
    }
    std::sort(runs.begin(), runs.end());
    if (!runs.empty()) runDir = runs.back();
  }
  auto latest = latestCheckpoint(runDir);
  if (!latest) {
    throw CheckpointError(runDir + ": no checkpoint to start from (" + (fs::path(runDir) / "checkpoints").string() +
                          " holds no complete step_N folder; set checkpoint.save_final: true in that run)");
  }
  const std::string dir = checkpointDir(runDir, *latest);
  for (const std::string& file : files) {
    const std::string path = (fs::path(dir) / file).string();
    if (!fs::exists(path)) continue;
    auto weights = loadSafetensors(path);
    for (ModelRuntime* runtime : runtimes) runtime->loadParameters(weights.tensors, path);
    return *latest;
  }
  std::string names;
  for (const auto& f : files) names += (names.empty() ? "" : " or ") + f;
  throw CheckpointError(dir + ": holds no " + names + ": not a checkpoint of a model this run can start from");
}

}  // namespace ptrain

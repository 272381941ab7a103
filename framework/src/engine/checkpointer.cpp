#include "engine/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "ptrain/comm/process_group.h"
#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/engine/runtime.h"
#include "ptrain/engine/sharded_checkpoint.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/engine/weights_source.h"

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

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The step folder's meta.json, refused when it names another step than the
// folder: a folder renamed by hand, or a copy of another one.
nlohmann::json readMeta(const std::string& dir, int64_t step) {
  const std::string path = (fs::path(dir) / "meta.json").string();
  nlohmann::json meta = readJsonFile(path);
  if (!meta.contains("step") || !meta["step"].is_number_integer() || meta["step"].get<int64_t>() != step) {
    throw CheckpointError(detail::concat(path, ": says step ", meta.contains("step") ? meta["step"].dump() : "(none)",
                                         ", but its folder is step_", step,
                                         ": the folder was renamed or copied; restore its name or remove it"));
  }
  return meta;
}

// The newest checkpoint of `runDir`, or a CheckpointError that says why none.
std::string latestDir(const std::string& runDir, const std::string& missingRun, const std::string& missingStep,
                      int64_t* step) {
  if (!fs::is_directory(runDir)) throw CheckpointError(runDir + ": run folder not found: " + missingRun);
  auto latest = latestCheckpoint(runDir);
  if (!latest) {
    throw CheckpointError(runDir + ": no checkpoint to " + missingStep + " (" +
                          (fs::path(runDir) / "checkpoints").string() + " holds no complete step_N folder" +
                          (missingStep == "start from" ? "; set checkpoint.save_final: true in that run" : "") + ")");
  }
  *step = *latest;
  return checkpointDir(runDir, *latest);
}

}  // namespace

CheckpointIo saveCheckpoint(const std::string& runDir, int64_t step, const std::vector<ModelRuntime*>& runtimes,
                            const Recipe& recipe, const nlohmann::json& extra, ProcessGroup& world) {
  const auto start = Clock::now();
  const at::Device device = runtimes.front()->device();
  const std::string what = checkpointDir(runDir, step);
  // Rank 0 makes the hidden folder; the others find it by rank 0's pid.
  std::string error;
  int64_t pid = 0;
  if (world.rank() == 0) {
    try {
      beginCheckpoint(runDir, step);
      pid = ::getpid();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agreeOnFailure(world, device, error, what);
  at::Tensor pidTensor = torch::tensor({pid}, torch::kInt64).to(device);
  if (world.size() > 1) world.broadcast(pidTensor)->wait();
  const std::string tmp = checkpointTmpDir(runDir, step, pidTensor.cpu().item<int64_t>());

  CheckpointIo io;
  try {
    io.bytes = writeShardedCheckpoint(tmp, step, runtimes, world);
  } catch (...) {
    if (world.rank() == 0) abandonCheckpoint(tmp);
    throw;
  }
  if (world.rank() == 0) {
    try {
      const nlohmann::json index = readJsonFile((fs::path(tmp) / kCheckpointIndexFile).string());
      nlohmann::json perRuntime = nlohmann::json::object();
      for (ModelRuntime* runtime : runtimes) {
        nlohmann::json shapes = nlohmann::json::object();
        const auto& tensors = index["runtimes"][runtime->name()]["parameters"];
        for (const auto& [name, entry] : tensors.items()) shapes[name] = entry["shape"];
        Optimizer* optimizer = runtime->optimizer();
        perRuntime[runtime->name()] = {{"layout", runtime->layout().describe()},
                                       {"optimizer_step", optimizer ? optimizer->stepCount() : 0},
                                       {"parameters", shapes}};
      }
      nlohmann::json meta{
          {"format", "ptrain.sharded"},
          {"step", step},
          {"data_position", step},  // index of the next global batch
          {"rng", {{"torch_cpu", toHex(at::detail::getDefaultCPUGenerator().get_state())}}},
          {"recipe", recipe.toYaml()},
          {"runtimes", perRuntime},
      };
      // The first runtime's figures at the top level too, where readers of a
      // single-model checkpoint look for them.
      const auto& first = perRuntime[runtimes.front()->name()];
      meta["optimizer_step"] = first["optimizer_step"];
      meta["layout"] = first["layout"];
      meta["parameters"] = first["parameters"];
      for (const auto& [key, value] : extra.items()) meta[key] = value;
      writeJsonFile((fs::path(tmp) / "meta.json").string(), meta);
      commitCheckpoint(runDir, step, tmp);
      pruneCheckpoints(runDir, static_cast<int>(recipe.getInt("checkpoint.keep")), step);
    } catch (const std::exception& e) {
      abandonCheckpoint(tmp);
      error = e.what();
    }
  }
  // Nobody runs ahead of a checkpoint that is still being written.
  agreeOnFailure(world, device, error, what);
  io.seconds = secondsSince(start);
  return io;
}

CheckpointIo restoreLatestCheckpoint(const std::string& runDir, const std::vector<ModelRuntime*>& runtimes,
                                     ProcessGroup& world, int64_t* step) {
  const auto start = Clock::now();
  const at::Device device = runtimes.front()->device();
  int64_t latest = 0;
  std::string error, dir;
  nlohmann::json meta;
  std::unique_ptr<CheckpointReader> reader;
  try {
    dir = latestDir(runDir, "--resume needs the --run-dir of an earlier run", "resume from", &latest);
    meta = readMeta(dir, latest);
    reader = std::make_unique<CheckpointReader>(dir);
    for (ModelRuntime* runtime : runtimes) {
      if (!reader->hasRuntime(runtime->name())) {
        throw CheckpointError(detail::concat(dir, ": holds no tensors of model '", runtime->name(),
                                             "': the checkpoint is from another run"));
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agreeOnFailure(world, device, error, runDir);
  // Every rank sees the same names and counts: no rank can refuse alone.
  for (ModelRuntime* runtime : runtimes) {
    const size_t saved = reader->names(runtime->name(), CheckpointSection::kParameters).size();
    const int64_t owned = runtime->ownedParameterCount();
    if (static_cast<int64_t>(saved) != owned) {
      throw CheckpointError(detail::concat(dir, ": holds ", saved, " parameters of model '", runtime->name(),
                                           "', this model has ", owned, ": the checkpoint is from another model"));
    }
  }
  try {
    for (ModelRuntime* runtime : runtimes) {
      int64_t optimizerSteps = meta.value("optimizer_step", int64_t{0});
      if (meta.contains("runtimes") && meta["runtimes"].contains(runtime->name())) {
        optimizerSteps = meta["runtimes"][runtime->name()].at("optimizer_step").get<int64_t>();
      }
      runtime->loadCheckpoint(*reader, runtime->name(), true, optimizerSteps);
    }
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(fromHex(meta.at("rng").at("torch_cpu").get<std::string>(), dir + "/meta.json"));
  } catch (const nlohmann::json::exception& e) {
    error = detail::concat(dir, "/meta.json: ", e.what());
  } catch (const std::exception& e) {
    error = e.what();
  }
  agreeOnFailure(world, device, error, dir);
  *step = latest;
  CheckpointIo io;
  io.bytes = reader->bytesRead();
  io.seconds = secondsSince(start);
  return io;
}

int64_t loadWeightsFromRun(const std::string& path, const std::vector<std::string>& sources,
                           const std::vector<ModelRuntime*>& runtimes, ProcessGroup& world,
                           const ForeignWeightsOpener& foreign) {
  const at::Device device = runtimes.front()->device();
  std::string error;
  int64_t step = -1;
  std::unique_ptr<CheckpointReader> reader;
  std::unique_ptr<WeightsSource> weights;
  try {
    weights = openWeights(path, sources, foreign, &reader, &step);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agreeOnFailure(world, device, error, path);
  const size_t saved = weights->names().size();
  for (ModelRuntime* runtime : runtimes) {
    const int64_t owned = runtime->ownedParameterCount();
    if (static_cast<int64_t>(saved) != owned) {
      throw CheckpointError(detail::concat(weights->where(), ": holds ", saved, " tensors, this model has ", owned,
                                           " parameters: the weights are of another model"));
    }
  }
  try {
    for (ModelRuntime* runtime : runtimes) runtime->loadWeights(*weights);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agreeOnFailure(world, device, error, weights->where());
  return step;
}

std::unique_ptr<WeightsSource> openWeights(const std::string& path, const std::vector<std::string>& sources,
                                           const ForeignWeightsOpener& foreign,
                                           std::unique_ptr<CheckpointReader>* reader, int64_t* step) {
  *step = -1;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return safetensorsWeights(path);
  if (foreign) {
    if (auto w = foreign(path)) return w;
  }
  if (isHuggingFaceFolder(path)) {
    throw CheckpointError(path + ": a Hugging Face model folder of a model this trainer does not read (the llm "
                                 "trainer reads GPT-2); give its model.safetensors if its names are this model's");
  }
  const std::string dir = resolveWeightsSource(path, step);
  readMeta(dir, *step);
  *reader = std::make_unique<CheckpointReader>(dir);
  for (const auto& s : sources) {
    if ((*reader)->hasRuntime(s)) return checkpointWeights(**reader, s);
  }
  std::string names;
  for (const auto& s : sources) names += (names.empty() ? "'" : " or '") + s + "'";
  throw CheckpointError(dir + ": holds no weights of model " + names +
                        ": not a checkpoint of a model this run can start from");
}

}  // namespace ptrain

#include "engine/checkpointer.h"

#include <filesystem>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "ptrain/comm/process_group.h"
#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/optimizer.h"
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

std::string shapeString(at::IntArrayRef sizes) {
  std::ostringstream os;
  os << sizes;
  return os.str();
}

}  // namespace

Checkpointer::Checkpointer(std::string runDir, const Recipe& recipe, std::string layout)
    : runDir_(std::move(runDir)), recipe_(recipe), layout_(std::move(layout)) {}

void Checkpointer::save(int64_t step, StagedModel& model, const Optimizer& optimizer, bool writer,
                        ProcessGroup& world) {
  if (writer) {
    torch::NoGradGuard noGrad;
    std::vector<std::pair<std::string, at::Tensor>> params;
    nlohmann::json shapes = nlohmann::json::object();
    for (const auto& item : model.module().named_parameters()) {
      params.emplace_back(item.key(), item.value().detach());
      shapes[item.key()] = item.value().sizes().vec();
    }
    nlohmann::json meta{
        {"step", step},
        {"data_position", step},  // index of the next global batch
        {"optimizer_step", optimizer.stepCount()},
        {"rng", {{"torch_cpu", toHex(at::detail::getDefaultCPUGenerator().get_state())}}},
        {"recipe", recipe_.toYaml()},
        {"layout", layout_},
        {"parameters", shapes},
    };
    writeCheckpointAtomically(runDir_, step, [&](const std::string& dir) {
      saveSafetensors((fs::path(dir) / "model.safetensors").string(), params, {{"format", "pt"}});
      saveSafetensors((fs::path(dir) / "optimizer.safetensors").string(), optimizer.state(), {{"format", "pt"}});
      writeJsonFile((fs::path(dir) / "meta.json").string(), meta);
    });
    pruneCheckpoints(runDir_, static_cast<int>(recipe_.getInt("checkpoint.keep")), step);
  }
  // Nobody runs ahead of a checkpoint that is still being written.
  world.barrier()->wait();
}

int64_t Checkpointer::restoreLatest(StagedModel& model, Optimizer& optimizer) {
  if (!fs::is_directory(runDir_)) {
    throw CheckpointError(runDir_ + ": run folder not found: --resume needs the --run-dir of an earlier run");
  }
  auto latest = latestCheckpoint(runDir_);
  if (!latest) {
    throw CheckpointError(runDir_ + ": no checkpoint to resume from (" + (fs::path(runDir_) / "checkpoints").string() +
                          " holds no complete step_N folder)");
  }
  const std::string dir = checkpointDir(runDir_, *latest);
  auto meta = readJsonFile((fs::path(dir) / "meta.json").string());
  auto weights = loadSafetensors((fs::path(dir) / "model.safetensors").string());
  torch::NoGradGuard noGrad;
  auto named = model.module().named_parameters();
  if (weights.tensors.size() != named.size()) {
    throw CheckpointError(detail::concat(dir, ": holds ", weights.tensors.size(), " parameters, this model has ",
                                         named.size(), ": the checkpoint is from another model"));
  }
  for (auto& item : named) {
    auto it = weights.tensors.find(item.key());
    if (it == weights.tensors.end()) {
      throw CheckpointError(detail::concat(dir, ": no parameter '", item.key(),
                                           "': the checkpoint is from another model"));
    }
    if (!it->second.sizes().equals(item.value().sizes())) {
      throw CheckpointError(detail::concat(dir, ": parameter '", item.key(), "' has shape ",
                                           shapeString(it->second.sizes()), ", this model has ",
                                           shapeString(item.value().sizes()), ": the checkpoint is from another model"));
    }
    item.value().copy_(it->second);
  }
  auto state = loadSafetensors((fs::path(dir) / "optimizer.safetensors").string());
  try {
    optimizer.load(state.tensors, meta.at("optimizer_step").get<int64_t>());
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(fromHex(meta.at("rng").at("torch_cpu").get<std::string>(), dir + "/meta.json"));
    return meta.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(detail::concat(dir, "/meta.json: ", e.what()));
  } catch (const CheckpointError& e) {
    throw CheckpointError(detail::concat(dir, ": ", e.what()));
  }
}

}  // namespace ptrain

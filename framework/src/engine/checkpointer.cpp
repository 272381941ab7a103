#include "engine/checkpointer.h"

#include <cstring>
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

// The full tensor of a shard: gathered over the group along the spec's dim.
at::Tensor unshard(const at::Tensor& shard, const ShardSpec& spec, ProcessGroup& group) {
  PTRAIN_CHECK(spec.num_shards == group.size(), "shard spec of ", spec.num_shards, " shards, group of ", group.size());
  // The group gathers dim-0 blocks: move the sharded dim to the front.
  at::Tensor front = shard.detach().transpose(0, spec.dim).contiguous();
  std::vector<int64_t> fullShape = front.sizes().vec();
  fullShape[0] *= spec.num_shards;
  at::Tensor gathered = torch::empty(fullShape, front.options());
  group.allgather(gathered, front)->wait();
  return gathered.transpose(0, spec.dim).contiguous();
}

// This rank's slice of a full tensor.
at::Tensor shardOf(const at::Tensor& full, const ShardSpec& spec) {
  const int64_t size = spec.full_size / spec.num_shards;
  return full.narrow(spec.dim, spec.index * size, size);
}

// Full-size tensors for every name, gathering the sharded ones.
std::vector<std::pair<std::string, at::Tensor>> unshardAll(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const std::function<const ShardSpec*(const std::string&)>& specOf, ProcessGroup& group) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, t] : tensors) {
    const ShardSpec* spec = specOf(name);
    out.emplace_back(name, spec ? unshard(t, *spec, group) : t.detach());
  }
  return out;
}

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Every stage's named tensors on stage 0 (in stage order); other stages get
// back what they passed. Each stage sends a description (names, dtypes,
// shapes as JSON) and then the tensors, point to point.
NamedTensors gatherToFirstStage(NamedTensors mine, ProcessGroup& group) {
  if (group.size() == 1) return mine;
  if (group.rank() != 0) {
    nlohmann::json description = nlohmann::json::array();
    for (const auto& [name, t] : mine) {
      description.push_back({{"name", name}, {"dtype", static_cast<int>(t.scalar_type())}, {"shape", t.sizes().vec()}});
    }
    const std::string text = description.dump();
    at::Tensor length = torch::tensor({static_cast<int64_t>(text.size())}, torch::kInt64);
    at::Tensor bytes = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
    std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
    std::vector<std::shared_ptr<Work>> sends{group.send(length, 0), group.send(bytes, 0)};
    std::vector<at::Tensor> payloads;
    for (const auto& [name, t] : mine) {
      payloads.push_back(t.detach().contiguous());
      sends.push_back(group.send(payloads.back(), 0));
    }
    for (auto& w : sends) w->wait();
    return mine;
  }
  NamedTensors all = std::move(mine);
  for (int stage = 1; stage < group.size(); ++stage) {
    at::Tensor length = torch::empty({1}, torch::kInt64);
    group.recv(length, stage)->wait();
    at::Tensor bytes = torch::empty({length.item<int64_t>()}, torch::kUInt8);
    group.recv(bytes, stage)->wait();
    auto description = nlohmann::json::parse(
        std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(bytes.numel())));
    for (const auto& entry : description) {
      at::Tensor t = torch::empty(entry.at("shape").get<std::vector<int64_t>>(),
                                  torch::TensorOptions().dtype(static_cast<at::ScalarType>(entry.at("dtype").get<int>())));
      group.recv(t, stage)->wait();
      all.emplace_back(entry.at("name").get<std::string>(), t);
    }
  }
  return all;
}

}  // namespace

Checkpointer::Checkpointer(std::string runDir, const Recipe& recipe, std::string layout,
                           std::shared_ptr<ProcessGroup> tensorGroup, std::shared_ptr<ProcessGroup> pipelineGroup,
                           bool inWriterPipeline)
    : runDir_(std::move(runDir)),
      recipe_(recipe),
      layout_(std::move(layout)),
      tensorGroup_(std::move(tensorGroup)),
      pipelineGroup_(std::move(pipelineGroup)),
      inWriterPipeline_(inWriterPipeline) {}

void Checkpointer::save(int64_t step, StagedModel& model, const Optimizer& optimizer, bool writer,
                        ProcessGroup& world) {
  torch::NoGradGuard noGrad;
  auto paramSpec = [&](const std::string& name) -> const ShardSpec* {
    auto it = model.shard_specs.find(name);
    return it == model.shard_specs.end() ? nullptr : &it->second;
  };
  // Optimizer moments are named "<moment>.<parameter>" and sharded like it.
  auto stateSpec = [&](const std::string& name) { return paramSpec(name.substr(name.find('.') + 1)); };
  // This stage's own tensors: not another stage's, nor a copy of one.
  auto owned = [&](const std::string& name) { return model.mirrored_parameters.count(name) == 0; };
  NamedTensors localParams, localMoments;
  for (auto& item : model.localParameters())
    if (owned(item.first)) localParams.push_back(std::move(item));
  for (auto& item : optimizer.state())
    if (owned(item.first.substr(item.first.find('.') + 1))) localMoments.push_back(std::move(item));
  auto params = unshardAll(localParams, paramSpec, *tensorGroup_);
  auto moments = unshardAll(localMoments, stateSpec, *tensorGroup_);
  if (inWriterPipeline_) {
    params = gatherToFirstStage(std::move(params), *pipelineGroup_);
    moments = gatherToFirstStage(std::move(moments), *pipelineGroup_);
  }
  if (writer) {
    nlohmann::json shapes = nlohmann::json::object();
    for (const auto& [name, t] : params) shapes[name] = t.sizes().vec();
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
      saveSafetensors((fs::path(dir) / "optimizer.safetensors").string(), moments, {{"format", "pt"}});
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
    if (model.remote_parameters.count(item.key()) > 0) continue;  // another pipeline stage's
    auto it = weights.tensors.find(item.key());
    if (it == weights.tensors.end()) {
      throw CheckpointError(detail::concat(dir, ": no parameter '", item.key(),
                                           "': the checkpoint is from another model"));
    }
    auto specIt = model.shard_specs.find(item.key());
    at::Tensor source = it->second;
    if (specIt != model.shard_specs.end()) {
      const ShardSpec& spec = specIt->second;
      if (source.dim() <= spec.dim || source.size(spec.dim) != spec.full_size) {
        throw CheckpointError(detail::concat(dir, ": parameter '", item.key(), "' has shape ",
                                             shapeString(source.sizes()), ", not ", spec.full_size, " along dim ",
                                             spec.dim, ": the checkpoint is from another model"));
      }
      source = shardOf(source, spec);
    }
    if (!source.sizes().equals(item.value().sizes())) {
      throw CheckpointError(detail::concat(dir, ": parameter '", item.key(), "' has shape ",
                                           shapeString(it->second.sizes()), ", this model has ",
                                           shapeString(item.value().sizes()), ": the checkpoint is from another model"));
    }
    item.value().copy_(source);
  }
  auto state = loadSafetensors((fs::path(dir) / "optimizer.safetensors").string());
  // Moments are stored full-size: take this rank's slice, as for parameters.
  for (auto& [name, t] : state.tensors) {
    auto specIt = model.shard_specs.find(name.substr(name.find('.') + 1));
    if (specIt != model.shard_specs.end() && t.dim() > specIt->second.dim &&
        t.size(specIt->second.dim) == specIt->second.full_size) {
      t = shardOf(t, specIt->second).contiguous();
    }
  }
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

#include "ptrain/engine/model.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "ptrain/engine/batch.h"
#include "ptrain/engine/engine.h"
#include "ptrain/engine/hooks.h"
#include "ptrain/engine/parallel.h"
#include "ptrain/engine/trainer.h"
#include "ptrain/engine/weights_source.h"
#include "ptrain/nn/deferred_init.h"
#include "ptrain/nn/moe.h"
#include "ptrain/nn/parallel_layers.h"

namespace ptrain {

StagedModel::~StagedModel() = default;
PipelineInference::~PipelineInference() = default;
Trainer::~Trainer() = default;
ParallelPlugin::~ParallelPlugin() = default;
StepHooks::~StepHooks() = default;

TrainSummary Trainer::train(TrainingSession& session) { return defaultTrainingLoop(session, *this); }

Batch Trainer::batchRows(int64_t step, int64_t globalBatchSize, int64_t begin, int64_t end) {
  return globalBatch(step, globalBatchSize).slice(begin, end);
}

void Trainer::exportWeights(const std::string& format, WeightsSource&, const std::string&) const {
  const std::vector<std::string> formats = exportFormats();
  std::string known;
  for (const auto& f : formats) known += (known.empty() ? "" : ", ") + f;
  throw ConfigError("--format " + format + ": this trainer exports " +
                    (known.empty() ? std::string("no format") : "only " + known));
}

std::unique_ptr<WeightsSource> Trainer::openForeignWeights(const std::string&) const { return nullptr; }

void Trainer::exportData(const std::string& name, const std::string&, int64_t, int64_t) const {
  const std::vector<std::string> names = exportableData();
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("ptrain data export " + name + ": this recipe's trainer exports " +
                    (known.empty() ? std::string("no built-in data set") : "only " + known));
}

nlohmann::json Trainer::dataPosition(int64_t, int64_t) const { return nullptr; }

bool ModelBuild::buildsBlock(int index) const {
  if (!blocks) return true;
  return std::binary_search(blocks->begin(), blocks->end(), index);
}

ModelBuild ModelBuild::outline() {
  ModelBuild b;
  b.blocks = std::vector<int>{};
  b.embed = false;
  b.head = false;
  return b;
}

at::Tensor MicroBatchRun::backwardLoss(const at::Tensor& lossSum) const {
  return lossSum * (loss_scale / loss_divisor);
}

int64_t StagedModel::blockCost(int index) {
  const std::string prefix = blockPrefix(index);
  int64_t cost = 0;
  for (const auto& item : module().named_parameters()) {
    if (item.key().compare(0, prefix.size(), prefix) == 0) cost += item.value().numel();
  }
  return cost;
}

void StagedModel::initialiseParameters() {
  torch::NoGradGuard noGrad;
  for (auto& item : module().named_parameters()) {
    at::Tensor& p = item.value();
    if (nn::isDeferred(p)) continue;
    const std::vector<int64_t> sizes = p.sizes().vec();
    auto init = parameterInit(item.key(), sizes);
    PTRAIN_CHECK(init.has_value(), "model: no initial value rule for parameter '", item.key(), "'");
    // Drawn on the host in float32 (so every device and dtype starts from
    // the same values), then copied in.
    at::Tensor values = torch::empty(p.sizes(), torch::TensorOptions(torch::kFloat32));
    nn::fillShard(values, *init, sizes, std::vector<int64_t>(sizes.size(), 0));
    p.copy_(values);
  }
}

int64_t StagedModel::materialiseParameters(at::Device device) {
  torch::NoGradGuard noGrad;
  int64_t bytes = 0;
  for (auto& item : module().named_parameters()) {
    at::Tensor& p = item.value();
    if (!nn::isDeferred(p)) continue;
    const ParameterPlacement& where = placement.of(item.key());
    const std::vector<int64_t> full = where.fullSizes(p.sizes());
    auto init = parameterInit(item.key(), full);
    PTRAIN_CHECK_AS(ConfigError, init.has_value(), "model: parameter '", item.key(),
                    "' was built without storage, but the model gives no rule for its initial values "
                    "(StagedModel::parameterInit), so no rank can draw its slice");
    at::Tensor values = torch::empty(p.sizes(), torch::TensorOptions(torch::kFloat32));
    nn::fillShard(values, *init, full, where.offsets(p.sizes()));
    bytes += values.numel() * static_cast<int64_t>(values.element_size());
    p.set_data(device.is_cpu() ? values : values.to(device));
  }
  return bytes;
}

std::vector<std::string> StagedModel::deferredParameters() {
  std::vector<std::string> out;
  for (const auto& item : module().named_parameters()) {
    if (nn::isDeferred(item.value())) out.push_back(item.key());
  }
  return out;
}

// The tensor-parallel defaults: a model that does not override them cannot
// be split.
namespace {
[[noreturn]] void noTensorParallel() {
  throw ConfigError(
      "parallel.tensor_model_parallel_size: this model does not support tensor parallelism; set it to 1");
}
}  // namespace

TensorParallelPlan StagedModel::tensorParallelPlan() { noTensorParallel(); }

void StagedModel::setTensorParallel(std::shared_ptr<const nn::TensorParallelState>) { noTensorParallel(); }

at::Tensor StagedModel::forwardBlock(int index, const at::Tensor& hidden) {
  return block_wrapper ? block_wrapper(index, hidden) : runBlock(index, hidden);
}

LossOutput StagedModel::forward(const Batch& micro) {
  if (!pipeline) return head(forwardHidden(micro), micro);
  torch::NoGradGuard noGrad;
  at::Tensor hidden = forwardHidden(micro);
  // On the device the stages compute on (where the micro-batch is, which every
  // stage is given): the pipeline's backend (NCCL on cuda) broadcasts there.
  const at::Device device = !micro.tensors.empty() ? micro.tensors.begin()->second.device()
                            : hidden.defined()     ? hidden.device()
                                                   : at::Device(at::kCPU);
  at::Tensor sums = torch::zeros({2}, torch::TensorOptions(torch::kFloat64).device(device));
  if (pipeline->isLastStage()) {
    LossOutput out = head(hidden, micro);
    sums[0] = out.loss_sum.to(torch::kFloat64);
    sums[1] = out.count;
  }
  pipeline->broadcastFromLastStage(sums);
  return LossOutput{sums[0], sums[1].item<double>()};
}

at::Tensor StagedModel::forwardHidden(const Batch& micro) {
  if (pipeline) return pipeline->forwardBlocks(*this, pipeline->isFirstStage() ? embed(micro) : at::Tensor());
  at::Tensor hidden = embed(micro);
  for (int i = 0; i < numBlocks(); ++i) hidden = forwardBlock(i, hidden);
  return hidden;
}

void StagedModel::shareFromHead(at::Tensor& tensor) {
  if (pipeline) pipeline->broadcastFromLastStage(tensor);
}

std::vector<std::pair<std::string, at::Tensor>> StagedModel::localParameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& item : module().named_parameters()) {
    if (placement.held(item.key())) out.emplace_back(item.key(), item.value());
  }
  return out;
}

int64_t Batch::size() const { return tensors.empty() ? 0 : tensors.begin()->second.size(0); }

Batch Batch::slice(int64_t begin, int64_t end) const {
  Batch out;
  for (const auto& [name, t] : tensors) out.tensors.emplace(name, t.slice(0, begin, end));
  return out;
}

Batch Batch::to(at::Device device) const {
  Batch out;
  for (const auto& [name, t] : tensors) out.tensors.emplace(name, t.device() == device ? t : t.to(device));
  return out;
}

const at::Tensor& Batch::at(const std::string& name) const {
  auto it = tensors.find(name);
  PTRAIN_CHECK(it != tensors.end(), "batch has no tensor named '", name, "'");
  return it->second;
}

std::optional<std::string> checkShardedBuild(StagedModel& model, int64_t tp, int64_t ep, int64_t etp) {
  std::vector<std::string> split;
  if (tp > 1) {
    TensorParallelPlan plan;
    try {
      plan = model.tensorParallelPlan();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    for (const auto& [prefix, layer] : plan.layers) {
      for (const auto& [local, dim] : layer->splitParameters()) split.push_back(prefix + local);
    }
  }
  if (ep > 1 || etp > 1) {
    for (const auto& [prefix, layer] : model.moeLayers()) {
      for (const auto& relative : nn::MoeLayerImpl::expertParameterNames()) split.push_back(prefix + relative);
    }
  }
  auto named = model.module().named_parameters();
  for (const auto& name : split) {
    const at::Tensor* p = named.find(name);
    if (p == nullptr) continue;  // the plan's own mistake, reported where it is applied
    if (!nn::isDeferred(*p)) {
      return detail::concat("the model cannot build a slice of parameter '", name,
                            "': its layer allocates it whole, so every rank would hold all of it (build it from "
                            "ptrain::nn layers, or register it with nn::splittableParameter)");
    }
    if (!model.parameterInit(name, p->sizes().vec())) {
      return detail::concat("the model cannot build a slice of parameter '", name,
                            "': it gives no rule for its initial values (StagedModel::parameterInit)");
    }
  }
  return std::nullopt;
}

}  // namespace ptrain

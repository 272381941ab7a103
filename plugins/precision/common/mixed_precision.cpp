#include "mixed_precision.h"

#include <torch/torch.h>

#include "ptrain/comm/communicator.h"
#include "ptrain/comm/process_group.h"
#include "ptrain/core/text.h"
#include "ptrain/engine/model.h"
#include "ptrain/nn/host_fallback.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain {
namespace {

const char* dtypeName(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    default: return "float32";
  }
}

// A float64 scalar, as a checkpoint keeps it (exact for every int64 counter
// a run reaches and for every float32 scale).
at::Tensor scalar(double v) { return torch::tensor({v}, torch::kFloat64); }

}  // namespace

MixedPrecision::MixedPrecision(const PluginContext& ctx, at::ScalarType dtype, bool scaled)
    : ctx_(ctx), dtype_(dtype) {
  if (scaled) {
    // Outside a recipe (`ptrain plugins`), Megatron's defaults.
    const PrecisionSettings settings = ctx.recipe ? PrecisionSettings::fromRecipe(*ctx.recipe) : PrecisionSettings{};
    scaler_.emplace(settings.scalerOptions());
    stepScale_ = scaler_->scale();
  }
}

void MixedPrecision::castModel(StagedModel& model) {
  if (dtype_ == at::kFloat) return;
  model.module().to(dtype_);
  if (ctx_.rank != 0 || !ctx_.device.is_cpu() || !ctx_.logger) return;
  // Said once per run, so a user knows which ops of an fp16 run are not
  // computed in fp16 on this build.
  static bool said = false;
  if (said) return;
  said = true;
  const auto missing = nn::missingHostKernels(dtype_);
  if (!missing.empty()) {
    ctx_.logger->info("precision {}: libtorch {} has no {} CPU kernel for {}; ptrain computes {} in float32 from {} "
                      "storage and rounds the results back",
                      dtypeName(dtype_), TORCH_VERSION, dtypeName(dtype_), text::joinOr(missing, ", ", " and "),
                      missing.size() == 1 ? "it" : "them", dtypeName(dtype_));
  }
}

void MixedPrecision::attach(StagedModel& model, const LayoutGroups& groups, bool trained) {
  world_ = &groups.world();
  // The parameters are final now (sharded, a pipeline stage's own).
  if (!trained || dtype_ == at::kFloat) return;
  for (auto& [name, p] : model.localParameters())
    if (p.requires_grad()) trained_params_.push_back(p);
}

void MixedPrecision::beginStep(const StepInfo&) {
  torch::NoGradGuard noGrad;
  for (auto& p : trained_params_) {
    if (!p.grad().defined() || p.grad().scalar_type() != at::kFloat || !p.grad().sizes().equals(p.sizes())) {
      p.mutable_grad() = torch::zeros(p.sizes(), p.options().dtype(at::kFloat));
    }
  }
}

double MixedPrecision::lossScale() { return scaler_ ? scaler_->scale() : 1.0; }

bool MixedPrecision::mayStep(const GradientCheck& check) {
  if (!scaler_) return true;
  torch::NoGradGuard noGrad;
  std::vector<at::Tensor> grads;
  for (const auto& p : *check.parameters)
    if (p.grad().defined()) grads.push_back(p.grad());
  // The largest magnitude of every gradient: inf when one holds inf, NaN
  // when one holds NaN, finite otherwise (a max cannot overflow).
  double found = 0;
  if (!grads.empty()) {
    // Offloaded gradients rest on the host: the maxima meet on the device.
    auto maxima = at::_foreach_norm(grads, std::numeric_limits<double>::infinity());
    for (auto& m : maxima) m = m.to(ctx_.device);
    at::Tensor largest = torch::stack(maxima).max();
    found = std::isfinite(largest.item<double>()) ? 0.0 : 1.0;
  }
  at::Tensor flag = torch::tensor({found}, torch::TensorOptions(torch::kFloat32).device(ctx_.device));
  if (world_ != nullptr && world_->size() > 1) {
    AllreduceOptions max;
    max.op = ReduceOp::kMax;
    world_->allreduce(flag, max)->wait();
  }
  overflow_ = flag.item<float>() > 0;
  return !overflow_;
}

void MixedPrecision::afterStep(const StepResult& result) {
  if (!scaler_) return;
  stepScale_ = result.loss_scale;
  if (overflow_) ++skipped_;
  scaler_->update(overflow_);
}

std::map<std::string, double> MixedPrecision::stepStats() const {
  if (!scaler_) return {};
  return {{"loss_scale", stepScale_}, {"skipped_steps", static_cast<double>(skipped_)}};
}

std::vector<std::pair<std::string, at::Tensor>> MixedPrecision::state() const {
  if (!scaler_) return {};
  const LossScalerState& s = scaler_->state();
  return {{"loss_scale", scalar(s.scale)},
          {"loss_scale_growth_tracker", scalar(static_cast<double>(s.growth_tracker))},
          {"loss_scale_hysteresis_tracker", scalar(static_cast<double>(s.hysteresis_tracker))},
          {"skipped_steps", scalar(static_cast<double>(skipped_))}};
}

void MixedPrecision::loadState(const std::map<std::string, at::Tensor>& state) {
  if (!scaler_) return;
  auto value = [&](const char* key) -> std::optional<double> {
    auto it = state.find(key);
    if (it == state.end()) return std::nullopt;
    return it->second.to(torch::kFloat64).item<double>();
  };
  auto scale = value("loss_scale");
  if (!scale) {
    // Saved by another precision: the scale starts afresh, as in a new run.
    if (ctx_.rank == 0 && ctx_.logger) {
      ctx_.logger->info("precision fp16: the checkpoint holds no loss scale; starting from {}", scaler_->scale());
    }
    return;
  }
  LossScalerState s;
  s.scale = static_cast<float>(*scale);
  s.growth_tracker = static_cast<int64_t>(value("loss_scale_growth_tracker").value_or(0));
  s.hysteresis_tracker = static_cast<int64_t>(value("loss_scale_hysteresis_tracker").value_or(0));
  scaler_->load(s);
  skipped_ = static_cast<int64_t>(value("skipped_steps").value_or(0));
  stepScale_ = scaler_->scale();
}

}  // namespace ptrain

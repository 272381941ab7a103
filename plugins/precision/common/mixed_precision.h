// MixedPrecision: the behaviour of the built-in precision plugins, one class
// with three settings:
//
//   fp32  float32 everywhere: no casts, no master weights, no loss scale.
//   bf16  bf16 parameters and activations; the optimizer keeps float32
//         master weights and steps on them; each parameter's gradient is a
//         float32 tensor that autograd adds every micro-batch's bf16
//         gradient into (Megatron's main_grad), so accumulation over
//         micro-batches and the reductions over ranks run in float32.
//   fp16  as bf16 in float16, plus a loss scale (engine/loss_scaler.h). The
//         gradients of a step are checked for inf and NaN after every
//         reduction; the flag is reduced with MAX over every rank of the
//         runtime, and an overflow vetoes the optimizer step on all of them
//         (parameters, optimizer state and the learning-rate schedule stay as
//         they are) before the scaler updates.
//
// The float32 gradient works because autograd accumulates into an existing
// gradient in place (grad += new_grad, which promotes the bf16 / fp16 term),
// and because this plugin's beginStep gives every trained parameter one
// before any other hook or backward runs. Gradient clipping and the norm see
// these gradients divided by the loss scale (the runtime does that).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "ptrain/engine/precision.h"

namespace ptrain {

class ProcessGroup;

class MixedPrecision : public PrecisionPlugin {
 public:
  // `scaled`: fp16's loss scaling, configured from the recipe's precision.* keys.
  MixedPrecision(const PluginContext& ctx, at::ScalarType dtype, bool scaled);

  at::ScalarType dtype() const override { return dtype_; }
  void castModel(StagedModel& model) override;
  void attach(StagedModel& model, const LayoutGroups& groups, bool trained) override;

  void beginStep(const StepInfo& info) override;
  double lossScale() override;
  bool mayStep(const GradientCheck& check) override;
  void afterStep(const StepResult& result) override;
  std::map<std::string, double> stepStats() const override;

  std::vector<std::pair<std::string, at::Tensor>> state() const override;
  void loadState(const std::map<std::string, at::Tensor>& state) override;

 private:
  PluginContext ctx_;
  at::ScalarType dtype_;
  std::optional<LossScaler> scaler_;
  ProcessGroup* world_ = nullptr;
  // The parameters that get a float32 gradient each step (bf16, fp16 with an optimizer).
  std::vector<at::Tensor> trained_params_;
  bool overflow_ = false;     // this step's gradients held inf or NaN on some rank
  double stepScale_ = 1;      // the scale this step ran with
  int64_t skipped_ = 0;       // steps skipped for overflow, over the whole run
};

}  // namespace ptrain

// PrecisionPlugin: the interface of a `precision` plugin (recipe section
// `precision`; built in: fp32, bf16, fp16). It owns the dtypes a model
// computes in and everything that follows from them:
//
//   - the dtype of parameters and activations (castModel);
//   - float32 master weights, kept and updated by the optimizer
//     (OptimizerOptions::master_weights) when the parameters are not float32;
//   - gradients accumulated in float32 across micro-batches (Megatron's
//     main_grad) when the parameters are not float32;
//   - the loss scale, and the veto of a step whose gradients overflowed
//     (StepHooks::lossScale / mayStep), with its state in checkpoints.
//
// A ModelRuntime creates the plugin its RuntimeOptions name, casts the model
// with it right after building it (before the parallel plugins apply), calls
// attach() after them, and runs it as the first of its step hooks: its
// beginStep comes before every other hook's, and its finishGradients after
// every other hook's (the gradients are final then: reduced over every group).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>

#include "ptrain/engine/hooks.h"
#include "ptrain/engine/loss_scaler.h"
#include "ptrain/plugin/plugin.h"

namespace ptrain {

class LayoutGroups;
class PluginRegistry;
class Recipe;
class StagedModel;

// The keys of the recipe's `precision` section.
struct PTRAIN_API PrecisionSettings {
  std::string name = "fp32";
  double loss_scale = 0;  // fp16: 0 = dynamic, > 0 = that constant scale
  double initial_loss_scale = 4294967296.0;  // 2^32
  double min_loss_scale = 1;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool fp16_lm_cross_entropy = false;

  static PrecisionSettings fromRecipe(const Recipe& recipe);
  LossScalerOptions scalerOptions() const;
};

// Settings that cannot work, one line each (location, key, what to change):
// a precision.name no installed plugin has (the line lists those there are),
// settings the plugin refuses, min_loss_scale above initial_loss_scale, and
// fp16-only keys set for another precision. Empty when the section is
// usable. `ptrain check` and `ptrain run` both ask it.
PTRAIN_API std::vector<std::string> checkPrecision(const Recipe& recipe, PluginRegistry& registry);

class PTRAIN_API PrecisionPlugin : public Plugin, public StepHooks {
 public:
  ~PrecisionPlugin() override;
  const char* kind() const final { return plugin_kind::kPrecision; }

  // The dtype of parameters and activations.
  virtual at::ScalarType dtype() const = 0;
  // Whether the optimizer keeps float32 master weights of the parameters.
  virtual bool masterWeights() const { return dtype() != at::kFloat; }
  // Casts the built model's parameters to dtype(). Before the parallel
  // plugins apply: they hook each parameter's gradient accumulator, which a
  // change of dtype would replace.
  virtual void castModel(StagedModel& model) = 0;
  // After the parallel plugins applied: `groups` are the runtime's (their
  // world() is every rank the model spans). `trained`: the runtime has an
  // optimizer (a frozen copy takes no steps).
  virtual void attach(StagedModel& model, const LayoutGroups& groups, bool trained) {}
  // State a checkpoint keeps (the loss scaler's), as named tensors that are
  // the same on every rank, and back. loadState gets what state() gave, or
  // an empty map for a checkpoint saved without it.
  virtual std::vector<std::pair<std::string, at::Tensor>> state() const { return {}; }
  virtual void loadState(const std::map<std::string, at::Tensor>& state) {}
};

}  // namespace ptrain

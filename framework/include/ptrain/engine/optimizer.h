// AdamW with decoupled weight decay, learning-rate schedules and global-norm
// gradient clipping.
//
// Update rule (as torch.optim.AdamW): p -= lr * wd * p; m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps).
// Parameters with fewer than two dimensions (biases, norm scales) get no
// weight decay. float32 tensors in host memory are updated by one fused pass
// per tensor (engine/adamw_kernel.cpp); others by multi-tensor (foreach)
// kernels. SGD (as torch.optim.SGD): g += wd * p; buf = momentum * buf + g;
// p -= lr * buf (buf = g without momentum).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain {

class Recipe;

struct OptimizerOptions {
  std::string name = "adamw";  // adamw | sgd
  double lr = 1e-3;
  double min_lr = 0;
  double weight_decay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double momentum = 0;  // sgd only
  double clip_grad = 1.0;  // 0: no clipping
  std::string schedule = "constant";  // constant | linear | cosine
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  static OptimizerOptions fromRecipe(const Recipe& recipe);
};

// Learning rate of `step` (0-based): linear warm-up from lr/warmup to lr over
// warmup_steps, then constant, or linear / cosine decay to min_lr at total_steps.
PTRAIN_API double learningRate(const OptimizerOptions& options, int64_t step);

class PTRAIN_API Optimizer {
 public:
  // `named` parameters, in a stable order; the optimizer keeps references.
  Optimizer(std::vector<std::pair<std::string, at::Tensor>> named, OptimizerOptions options);

  // One update with learning rate `lr`, each gradient multiplied by
  // `gradScale` first (the clipping coefficient; later also 1 / loss scale).
  // The gradients themselves are left as they are, except on the foreach path
  // where they are scaled in place. Parameters without a gradient are skipped.
  void step(double lr, double gradScale = 1.0);
  void zeroGrad();
  int64_t stepCount() const { return step_; }
  const OptimizerOptions& options() const { return options_; }
  // The parameters it updates, in order.
  const std::vector<at::Tensor>& parameters() const { return params_; }
  const std::vector<std::string>& parameterNames() const { return names_; }

  // State as named tensors ("exp_avg.<param>", "exp_avg_sq.<param>") for
  // checkpoints, and back. load() checks names and shapes (CheckpointError).
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  void load(const std::map<std::string, at::Tensor>& state, int64_t stepCount);

 private:
  OptimizerOptions options_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_, expAvg_, expAvgSq_;
  std::vector<bool> hasDecay_;
  int64_t step_ = 0;
};

// The global L2 norm of the gradients of `params`. `counted` says which of
// them this rank adds to the norm (empty: all), so a parameter replicated
// across tensor-parallel ranks is counted once; `sumSquares`, when given,
// turns the local sum of squares (float64 scalar) into the global one (e.g. an
// all-reduce over the model-parallel group).
PTRAIN_API double globalGradNorm(const std::vector<at::Tensor>& params,
                                 const std::function<void(at::Tensor&)>& sumSquares = {},
                                 const std::vector<bool>& counted = {});

// The factor that brings gradients of global norm `norm` down to `maxNorm`:
// maxNorm / (norm + 1e-6) when norm exceeds it, else 1 (and 1 when maxNorm <= 0).
PTRAIN_API double clipCoefficient(double norm, double maxNorm);

}  // namespace ptrain

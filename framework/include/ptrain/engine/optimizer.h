// Optimizers: one interface (parameter groups, optional fp32 master weights,
// a step that says whether it applied, state for checkpoints), AdamW and SGD
// behind it, learning-rate schedules and global-norm gradient clipping.
//
// AdamW (as torch.optim.AdamW): p -= lr * wd * p; m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps).
// float32 tensors in host memory are updated by one fused pass per tensor
// (engine/adamw_kernel.cpp); others by multi-tensor (foreach) kernels.
// SGD (as torch.optim.SGD): g += wd * p; buf = momentum * buf + g;
// p -= lr * buf (buf = g without momentum, which then keeps no state).
//
// Parameter groups: makeOptimizer puts tensors of two or more dimensions in
// a group with weight decay and the rest (biases, norm scales) in one
// without, as Megatron-LM does. Each group has its own weight decay and a
// learning-rate multiplier.
//
// Sparse rows (OptimizerOptions::sparse_name, docs/embedding_tables.md):
// parameters whose names start with one of sparse_prefixes (embedding tables,
// [rows, dim]) are updated row by row, and only the rows "touched" in the
// step, those whose gradient row is not all zero; every other row, and its
// state, stays bitwise as it is. The other parameters are updated by AdamW in
// the default groups. The sparse rows form a group "sparse" of their own
// (weight decay sparse_weight_decay, learning rate sparse_lr).
//   rowwise_adagrad (FBGEMM's exact row-wise Adagrad): per touched row i,
//     g = grad_i + wd * p_i; s_i += mean(g^2); p_i -= lr * g / (sqrt(s_i) + eps).
//     One float ("row_sum", [rows]) of state per row.
//   sparse_adam (torch.optim.SparseAdam, "lazy Adam"): per touched row,
//     p *= 1 - lr * wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//     p -= lr * sqrt(1-b2^t) / (1-b1^t) * m / (sqrt(v) + eps), t the applied
//     step count. Untouched rows keep their moments (unlike dense Adam).
//
// Master weights (OptimizerOptions::master_weights): for every parameter that
// is not float32 the optimizer keeps a float32 copy, updates the copy from the
// gradient (read as float32) and writes the rounded result back into the
// parameter, so low-precision training accumulates its updates in float32
// (Megatron's main params). The copies are part of state() ("master.<name>").
//
// Thread-safety: one thread at a time.
#pragma once

#include <functional>
#include <optional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain {

class Recipe;

struct PTRAIN_API OptimizerOptions {
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
  bool master_weights = false;  // float32 copies of parameters of other dtypes
  // States and masters sharded over the data-parallel group
  // (engine/distributed_optimizer.h); read by the runtime.
  bool distributed = false;
  // Sparse rows (above): "none" | "rowwise_adagrad" | "sparse_adam"; with
  // another value than "none", `name` must be adamw.
  std::string sparse_name = "none";
  std::vector<std::string> sparse_prefixes;  // e.g. {"embeddings."}
  double sparse_lr = 0;            // peak lr of the sparse rows; 0: lr (the schedule scales both alike)
  double sparse_weight_decay = 0;  // L2 (rowwise_adagrad) or decoupled (sparse_adam), touched rows only
  // True when sparse_name is set and `parameterName` starts with a prefix.
  bool isSparse(const std::string& parameterName) const;
  static OptimizerOptions fromRecipe(const Recipe& recipe);
};

// Learning rate of applied step `step` (0-based): linear warm-up from
// lr/warmup to lr over warmup_steps, then constant, or linear / cosine decay
// to min_lr at total_steps.
PTRAIN_API double learningRate(const OptimizerOptions& options, int64_t step);

// Parameters updated with the same hyper-parameters.
struct ParamGroup {
  std::string name;           // e.g. "decay", "no_decay"
  double weight_decay = 0;    // decoupled (adamw) or L2 penalty (sgd)
  double lr_scale = 1;        // multiplies the step's learning rate
  std::vector<size_t> index;  // positions in Optimizer::parameters()
};

class PTRAIN_API Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // "adamw", "sgd", "adamw+rowwise_adagrad", "adamw+sparse_adam".
  virtual const char* name() const = 0;

  // One update with learning rate `lr`, each gradient multiplied by
  // `gradScale` first (the clipping coefficient, and 1 / loss scale). The
  // gradients themselves are left as they are, except on the foreach path
  // where they are scaled in place. Parameters without a gradient are
  // skipped. Returns whether the update was applied; only applied steps count
  // (stepCount) and move the learning-rate schedule on.
  bool step(double lr, double gradScale = 1.0);
  // Zeroes every gradient, except those releasesGradient names, which are
  // released (undefined) instead.
  void zeroGrad();
  // Applied steps so far (restored from checkpoints).
  int64_t stepCount() const { return step_; }
  // Sets the count of applied steps: a checkpoint loaded into state() in
  // place.
  void setStepCount(int64_t steps) { step_ = steps; }

  // The parameters it updates, in the order they were given, and their names.
  const std::vector<at::Tensor>& parameters() const { return params_; }
  const std::vector<std::string>& parameterNames() const { return names_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // The per-parameter state slots, e.g. {"exp_avg", "exp_avg_sq"}.
  const std::vector<std::string>& slotNames() const { return slotNames_; }
  // The float32 copy of parameter i, or an undefined tensor.
  const at::Tensor& master(size_t i) const { return master_[i]; }
  // The tensors the optimizer keeps for parameter i: its state slots (those
  // it has: a sparse optimizer gives a parameter only some), then
  // its master when it has one. The same tensor objects it updates, so a
  // caller may move their storage (Tensor::set_data, e.g. to an offload
  // tier) between steps.
  std::vector<at::Tensor> stateOf(size_t i) const;

  // When set, step() updates the parameters one at a time and calls it
  // before (done = false) and after (done = true) each one's update, with its
  // index in parameters(): an offload tier brings the parameter's tensors in
  // and writes them back. The update reads the parameter, its gradient and
  // its state after the observer returns, so the observer may move them (to
  // the host, where an offloaded optimizer steps). The arithmetic is the same
  // (every kernel is element-wise).
  std::function<void(size_t index, bool done)> update_observer;

  // State as named tensors "<slot>.<param>" (e.g. "exp_avg.blocks.0.w",
  // "master.blocks.0.w", "row_sum.embeddings.row_wise.user") for
  // checkpoints, parameter by parameter, and back; a slot a parameter does
  // not have is left out.
  // load() checks names and shapes (CheckpointError) and restores the count
  // of applied steps.
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  void load(const std::map<std::string, at::Tensor>& state, int64_t stepCount);

 protected:
  // Parameter `index`'s gradient is dropped rather than zeroed after a step:
  // the sparse rows' tables, whose next gradient autograd then takes as it
  // comes (one dense [rows, dim] tensor per lookup) instead of adding it into
  // a zeroed one: two passes over the table fewer per step.
  virtual bool releasesGradient(size_t index) const { return false; }

  // `named` in a stable order (parameters without requires_grad are left
  // out); every kept parameter in exactly one group. Slots: the per-parameter
  // state tensors the optimizer keeps (e.g. {"exp_avg", "exp_avg_sq"}),
  // created as zeros shaped like the parameter, float32 when it has a master.
  Optimizer(std::vector<std::pair<std::string, at::Tensor>> named, std::vector<ParamGroup> groups,
            std::vector<std::string> slots, bool masterWeights);
  // The same with slot shapes of the caller's choosing: slotSizes(s, name, p)
  // gives the sizes of slot s of parameter `name` (p: the tensor the slot
  // goes with, its master when it has one), or nullopt when the parameter has
  // no such slot (then slot(s, i) is undefined).
  using SlotSizes = std::function<std::optional<std::vector<int64_t>>(size_t slot, const std::string& name,
                                                                      const at::Tensor& p)>;
  Optimizer(std::vector<std::pair<std::string, at::Tensor>> named, std::vector<ParamGroup> groups,
            std::vector<std::string> slots, bool masterWeights, const SlotSizes& slotSizes);

  // One parameter's part of an update.
  struct Item {
    size_t index;          // into parameters()
    at::Tensor target;     // what to update: the parameter, or its float32 master
    at::Tensor grad;       // its gradient (float32 when there is a master)
    double lr;             // the step's lr times the group's lr_scale
    double weight_decay;   // the group's
  };
  // Updates every item; `count` is the applied step being made (1-based).
  virtual void update(const std::vector<Item>& items, double gradScale, int64_t count) = 0;
  // State slot `s` (in the order given to the constructor) of parameter i.
  at::Tensor& slot(size_t s, size_t i) { return slots_[s][i]; }

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> master_;
  std::vector<ParamGroup> groups_;
  std::vector<size_t> groupOf_;
  std::vector<std::string> slotNames_;
  std::vector<std::vector<at::Tensor>> slots_;
  int64_t step_ = 0;
};

// The optimizer `options.name` over `named`, in the default groups: weight
// decay for tensors of two or more dimensions, none for the others. With
// options.sparse_name set, the parameters options.isSparse names go to a third
// group, "sparse", updated by the sparse optimizer (ConfigError when one is
// not 2-d, or when name is not adamw).
PTRAIN_API std::unique_ptr<Optimizer> makeOptimizer(std::vector<std::pair<std::string, at::Tensor>> named,
                                                    const OptimizerOptions& options);
// The same with groups of the caller's choosing (each parameter in exactly
// one); with options.sparse_name set, the parameters options.isSparse names
// are updated by the sparse optimizer whatever their group.
PTRAIN_API std::unique_ptr<Optimizer> makeOptimizer(std::vector<std::pair<std::string, at::Tensor>> named,
                                                    std::vector<ParamGroup> groups, const OptimizerOptions& options);

// The global L2 norm of the gradients of `params`. `counted` says which of
// them this rank adds to the norm (empty: all), so a parameter replicated
// across ranks is counted once; `sumSquares`, when given, turns the local sum
// of squares (a float64 scalar on `device`, where the model computes; by
// default the first gradient's) into
// the global one (e.g. an all-reduce over the world). Gradients may rest on
// other devices (an offload tier's host memory): each is normed where it is.
PTRAIN_API double globalGradNorm(const std::vector<at::Tensor>& params,
                                 const std::function<void(at::Tensor&)>& sumSquares = {},
                                 const std::vector<bool>& counted = {},
                                 std::optional<at::Device> device = std::nullopt);

// The factor that brings gradients of global norm `norm` down to `maxNorm`:
// maxNorm / (norm + 1e-6) when norm exceeds it, else 1 (and 1 when maxNorm <= 0).
PTRAIN_API double clipCoefficient(double norm, double maxNorm);

}  // namespace ptrain

// StepHooks: the phases of a training step in which a plugin may act.
//
// A ModelRuntime (engine/runtime.h) runs one step of its model as:
//
//   beginStep                          every hook, in order
//   lossScale                          product over hooks: the loss is multiplied by it before backward
//   beforeMicroBatches(scale)          every hook, with that product
//   for each micro-batch (or in the order a pipeline schedules them):
//     embed -> for each block: runBlock   (hooks nest: the first hook is outermost)
//            -> loss function
//     beforeBackward(index, count)     every hook, in order
//     backward: beforeBlockBackward(i) when the gradient reaches block i's
//               output, afterBlockBackward(i) when it has passed its input
//               (only for hooks whose observesBlockBackward() is true)
//   finishGradients                    every hook, in reverse order (the data plugin's reductions first)
//   gradients divided by the loss scale, global norm, clipping coefficient
//   mayStep                            every hook; any false skips the optimizer step
//   optimizer step (when allowed)      the learning-rate schedule advances only on applied steps
//   afterStep(result)                  every hook, in order
//
// Parallel plugins (engine/parallel.h) are hooks; so are precision, offload
// and recomputation plugins, and a test may add its own
// (ModelRuntime::addHooks). Every method has a default that does nothing.
//
// Thread-safety: the runtime calls hooks on the thread that runs the step.
// Collectives a hook issues must be issued in the same order on every rank
// of the runtime.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain {

// What a step is about to do.
struct StepInfo {
  int64_t step = 0;       // 0-based index of the step in its runtime's training
  int micro_batches = 0;  // this rank's micro-batches in the step (the same on every data-parallel rank)
  // Micro-batches of the whole global batch, every data-parallel rank's, over
  // every device group (parallel.groups, whose groups cut their rows into
  // different counts); 0 without groups: micro_batches x the data-parallel size.
  double job_micro_batches = 0;
};

// What mayStep() may look at: the gradients after every hook's
// finishGradients, already divided by the loss scale.
struct GradientCheck {
  const std::vector<at::Tensor>* parameters = nullptr;  // what the optimizer would update
  double grad_norm = 0;  // global L2 norm over every rank (not finite when any gradient is inf or NaN)
};

// What a step did.
struct StepResult {
  int64_t step = 0;
  double loss = 0;        // global loss sum / the step's loss divisor; the same on every rank
  double loss_sum = 0;    // the loss summed over the global batch
  double grad_norm = 0;   // global gradient norm before clipping (loss scale removed)
  double lr = 0;          // learning rate of the update (or of the skipped one)
  double loss_scale = 1;  // the loss scale the step ran with
  bool applied = false;   // the optimizer updated the parameters
  // The loss or the gradient norm was NaN or inf and no hook owned the skip
  // (fp16's loss scaler owns its overflow steps): the parameters were left
  // as they were, and the engine applies train.on_nonfinite.
  bool nonfinite = false;
  std::map<std::string, double> stats;  // every hook's stepStats()
};

// Runs one block (or the next hook's wrapper around it) on an input.
using BlockRunner = std::function<at::Tensor(const at::Tensor& input)>;

class PTRAIN_API StepHooks {
 public:
  virtual ~StepHooks();

  virtual void beginStep(const StepInfo& info) {}
  // The factor the loss is multiplied by before backward (fp16 loss scaling);
  // the runtime divides the gradients by the product of all hooks' factors
  // before the norm, clipping and the optimizer see them. Asked once per step,
  // after beginStep.
  virtual double lossScale() { return 1.0; }
  // Once per step, after lossScale(), with the product of every hook's
  // scale: the factor backward's gradients carry this step (for a hook that
  // injects gradients of its own, e.g. an auxiliary loss).
  virtual void beforeMicroBatches(double lossScale) {}
  // Runs block `index` on `input`. The default calls `next(input)`; a hook may
  // act before and after (bring the block's parameters in, release them) or
  // compute the same result another way (recompute it during backward). It
  // must return what `next(input)` returns, as a function of `input` that
  // autograd can differentiate.
  virtual at::Tensor runBlock(int index, const at::Tensor& input, const BlockRunner& next) { return next(input); }
  // True to receive beforeBlockBackward / afterBlockBackward. The runtime only
  // adds the autograd nodes that report them when some hook asks.
  virtual bool observesBlockBackward() const { return false; }
  // During backward: the gradient has reached block `index`'s output (its
  // parameters' gradients are about to be computed) ...
  virtual void beforeBlockBackward(int index) {}
  // ... and has passed the block's input (its parameter gradients of this
  // micro-batch are accumulated).
  virtual void afterBlockBackward(int index) {}
  // Before the backward pass of micro-batch `index` of `count` this step.
  virtual void beforeBackward(int index, int count) {}
  // After the last backward pass of a step, in reverse order of the hooks:
  // every gradient this hook is responsible for must be final when it returns.
  virtual void finishGradients() {}
  // May the optimizer apply this step? Every rank of the runtime must give the
  // same answer (a hook reduces its own evidence, e.g. an overflow flag, over
  // the ranks). One false skips the update on every rank: parameters and
  // optimizer state stay as they are and the learning-rate schedule does not
  // advance.
  virtual bool mayStep(const GradientCheck& check) { return true; }
  // After the step, applied or not.
  virtual void afterStep(const StepResult& result) {}
  // Figures of the last step (e.g. "dp_comm_bytes"), merged into the metrics.
  virtual std::map<std::string, double> stepStats() const { return {}; }
};

}  // namespace ptrain

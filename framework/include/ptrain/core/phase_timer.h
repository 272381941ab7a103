// Where a training step's time goes: each part of a step (its data, forward
// and backward passes, gradient reduction, optimizer, pipeline waits, and the
// evaluation and checkpoint that follow it) timed by a scope around it, and
// marked as a range in a profiler trace (log.profile_steps) while one records.
//
// Times are exclusive: a scope opened inside another pauses the outer one
// until it closes, so the phases of a step add up to the time its outermost
// scope was open. Each thread keeps its own clock; the engine reads the
// training loop's thread (work that runs on other threads, such as a GPU's
// backward pass, counts where the loop's thread waits for it).
#pragma once

#include <array>
#include <string>

#include "ptrain/core/error.h"

namespace ptrain {

enum class Phase {
  kData,             // making this rank's rows of the batch and its micro-batches
  kForwardBackward,  // the model's forward and backward passes
  kGradReduce,       // gradient reductions: data-parallel sums, tensor-parallel sums, reduce-scatters
  kPipelineWait,     // waiting for another pipeline stage's activations or gradients
  kOptimizer,        // the update: loss and norm sums, clipping, the optimizer
  kRollout,          // generating samples to learn from (GRPO's rollouts and their scores)
  kEval,             // evaluation after a step
  kCheckpoint,       // saving a checkpoint after a step
  kOther,            // the rest: metrics, logging, the loop itself
  kCount
};

// "data", "forward_backward", "grad_reduce", "pipeline_wait", "optimizer",
// "rollout", "eval", "checkpoint", "other".
PTRAIN_API const char* phaseName(Phase phase);

// Seconds per phase, indexed by Phase.
using PhaseSeconds = std::array<double, static_cast<size_t>(Phase::kCount)>;

// Times its phase from construction to destruction on the calling thread, and
// records a "ptrain::<phase>" range when a profiler records. Not copyable;
// scopes nest strictly (destroyed in reverse order of construction).
class PTRAIN_API PhaseScope {
 public:
  explicit PhaseScope(Phase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase previous_;
  bool hadPrevious_;
  void* range_;  // the profiler's range (an at::RecordFunction), null when none records
};

// This thread's seconds per phase since the last call (scopes still open
// count up to now), and starts them again from zero.
PTRAIN_API PhaseSeconds takePhaseSeconds();

// A range "ptrain::<what> <detail>" in a profiler trace while one records
// (nothing otherwise, not even the name), for what is not a phase, such as
// each collective ("ptrain::allreduce tp0"). Not copyable.
class PTRAIN_API ProfileRange {
 public:
  ProfileRange(const char* what, const std::string& detail);
  ~ProfileRange();
  ProfileRange(const ProfileRange&) = delete;
  ProfileRange& operator=(const ProfileRange&) = delete;

 private:
  void* range_;
};

}  // namespace ptrain

// log.profile_steps: libtorch's profiler over a window of training steps.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace ptrain {

// Records training steps [first, last] (1-based) of this rank and writes
// them as a Chrome/Perfetto trace to `path` when the last one ends (or when
// destroyed mid-window: a run that stops early still leaves its trace; a
// resumed run that starts inside the window records the rest of it).
// Builds with CUDA use libtorch's Kineto profiler (operators on the host and
// the GPU's kernels, written as {"traceEvents": [...]}); others its legacy
// profiler (host operators, written as a JSON array of events). Either holds
// ptrain's ranges (core/phase_timer.h). Inactive when first is 0.
class StepProfiler {
 public:
  StepProfiler(int64_t first, int64_t last, std::string path, bool cuda);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Around each training step `step` (1-based), on the loop's thread.
  void beforeStep(int64_t step);
  void afterStep(int64_t step);

 private:
  void stop();
  int64_t first_, last_;
  std::string path_;
  bool cuda_;
  bool done_ = false;  // the window was recorded and written
  struct Recording;
  std::unique_ptr<Recording> recording_;  // while the window is open
};

}  // namespace ptrain

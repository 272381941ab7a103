#include "engine/step_profiler.h"

#include <filesystem>

#include <torch/csrc/autograd/profiler_legacy.h>
#if PTRAIN_WITH_CUDA
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

#include "ptrain/core/error.h"
#include "ptrain/core/logging.h"

namespace ptrain {

namespace profiler = torch::autograd::profiler;

struct StepProfiler::Recording {
  // The legacy profiler writes its trace when this guard ends.
  std::unique_ptr<profiler::RecordProfile> legacy;
  bool kineto = false;
};

StepProfiler::StepProfiler(int64_t first, int64_t last, std::string path, bool cuda)
    : first_(first), last_(last), path_(std::move(path)), cuda_(cuda) {}

StepProfiler::~StepProfiler() {
  try {
    stop();
  } catch (const std::exception& e) {
    logger()->warn("log.profile_steps: the trace {} could not be written: {}", path_, e.what());
  }
}

void StepProfiler::beforeStep(int64_t step) {
  // A resumed run that starts inside the window records the rest of it.
  if (first_ <= 0 || step < first_ || step > last_ || recording_ || done_) return;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
  recording_ = std::make_unique<Recording>();
#if PTRAIN_WITH_CUDA
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  const ProfilerConfig config(ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda_) activities.insert(ActivityType::CUDA);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  recording_->kineto = true;
#else
  (void)cuda_;
  recording_->legacy = std::make_unique<profiler::RecordProfile>(path_);
#endif
}

void StepProfiler::afterStep(int64_t step) {
  if (recording_ && step >= last_) stop();
}

void StepProfiler::stop() {
  if (!recording_) return;
  done_ = true;
  std::unique_ptr<Recording> done = std::move(recording_);
#if PTRAIN_WITH_CUDA
  if (done->kineto) profiler::disableProfiler()->save(path_);
#endif
  done.reset();  // the legacy guard writes its file here
  logger()->info("log.profile_steps: trace of steps {} to {} written to {}", first_, last_, path_);
}

}  // namespace ptrain

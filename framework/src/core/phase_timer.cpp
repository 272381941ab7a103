#include "ptrain/core/phase_timer.h"

#include <chrono>
#include <memory>
#include <string>

#include <ATen/record_function.h>

namespace ptrain {
namespace {

using Clock = std::chrono::steady_clock;

// One thread's clock: the phase being timed now (the innermost open scope)
// and since when, and the seconds each phase has had.
struct ThreadClock {
  PhaseSeconds seconds{};
  bool running = false;
  Phase current = Phase::kOther;
  Clock::time_point since;

  // Charges the time since the last switch to the current phase.
  void charge(Clock::time_point now) {
    if (running) seconds[static_cast<size_t>(current)] += std::chrono::duration<double>(now - since).count();
    since = now;
  }
};

thread_local ThreadClock tClock;

// A profiler range: an at::RecordFunction of USER_SCOPE and the name it was
// given (kept alive with it, as newer libtorch holds only a view of it).
struct Range {
  std::string name;
  at::RecordFunction function{at::RecordScope::USER_SCOPE};
};

// A Range named `name`, or null when no profiler (or other observer) wants
// one: what RECORD_USER_SCOPE does, kept alive beyond one C++ scope.
template <typename MakeName>
void* beginRange(MakeName makeName) {
  if (!at::hasCallbacks()) return nullptr;  // no observer at all: the common case, for free
  auto range = std::make_unique<Range>();
  if (!range->function.isActive()) return nullptr;
  range->name = makeName();
  at::detail::record_function_with_scope(range->function, range->name, c10::ArrayRef<const c10::IValue>{});
  return range.release();
}

void endRange(void* range) { delete static_cast<Range*>(range); }

constexpr const char* kRangeNames[] = {"ptrain::data",      "ptrain::forward_backward", "ptrain::grad_reduce",
                                       "ptrain::pipeline_wait", "ptrain::optimizer",     "ptrain::rollout",
                                       "ptrain::eval",      "ptrain::checkpoint",       "ptrain::other"};
static_assert(sizeof(kRangeNames) / sizeof(kRangeNames[0]) == static_cast<size_t>(Phase::kCount));

}  // namespace

const char* phaseName(Phase phase) {
  // The range names without their "ptrain::".
  return kRangeNames[static_cast<size_t>(phase)] + 8;
}

PhaseScope::PhaseScope(Phase phase)
    : previous_(tClock.current), hadPrevious_(tClock.running), range_(beginRange([phase] { return std::string(kRangeNames[static_cast<size_t>(phase)]); })) {
  tClock.charge(Clock::now());
  tClock.current = phase;
  tClock.running = true;
}

PhaseScope::~PhaseScope() {
  tClock.charge(Clock::now());
  tClock.current = previous_;
  tClock.running = hadPrevious_;
  if (range_ != nullptr) endRange(range_);
}

PhaseSeconds takePhaseSeconds() {
  tClock.charge(Clock::now());
  PhaseSeconds taken = tClock.seconds;
  tClock.seconds.fill(0);
  return taken;
}

ProfileRange::ProfileRange(const char* what, const std::string& detail)
    : range_(beginRange([&] { return std::string("ptrain::") + what + (detail.empty() ? "" : " " + detail); })) {}

ProfileRange::~ProfileRange() {
  if (range_ != nullptr) endRange(range_);
}

}  // namespace ptrain

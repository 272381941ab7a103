// Watchdog: deadlines for operations that run on a device queue while the
// host goes on (stream-ordered NCCL collectives, as c10d's own watchdog
// keeps them).
//
// A stream-ordered wait() returns at once: the compute stream waits for the
// collective, the host does not. A stuck collective (a peer that never
// joined) would then stall the device forever, and the host at its next
// synchronisation. The watchdog polls every watched operation from one
// background thread; when one is still running at its deadline it calls the
// operation's `expire` (which aborts the communicator, so the stuck kernel
// ends, and records the TimeoutError the group raises from then on), once,
// and forgets it. A completed operation is forgotten at the next poll.
//
// Thread-safety: watch() may be called from any thread; `done` and `expire`
// run on the watchdog's thread, never at the same time for one operation.
// The instance() singleton lives until the process ends (its thread too,
// idle when nothing is watched), so no exit-time destructor can race it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain {

class PTRAIN_API Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // `poll`: how often a watched operation is checked.
  explicit Watchdog(std::chrono::milliseconds poll = std::chrono::milliseconds(20));
  // Stops the thread; operations still watched are forgotten (not expired).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The process's watchdog (never destroyed).
  static Watchdog& instance();

  // Watches one operation: `done()` says whether it completed (it must not
  // block); `expire()` runs once if it has not by `deadline`.
  void watch(std::function<bool()> done, std::function<void()> expire, Clock::time_point deadline);

  // Operations watched now, those being checked at this moment included (an
  // operation leaves the count once it completed, or expired and its
  // `expire()` returned).
  size_t watching() const;
  // Operations expired since the watchdog started.
  int64_t expired() const;

 private:
  struct Entry {
    std::function<bool()> done;
    std::function<void()> expire;
    Clock::time_point deadline;
  };
  void run();

  const std::chrono::milliseconds poll_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Entry> entries_;
  // Entries the watchdog's thread took out of entries_ to check outside the lock.
  size_t checking_ = 0;
  bool stop_ = false;
  int64_t expired_ = 0;
  std::thread thread_;
};

}  // namespace ptrain

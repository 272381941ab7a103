#include "ptrain/comm/watchdog.h"

#include <utility>

namespace ptrain {

Watchdog::Watchdog(std::chrono::milliseconds poll) : poll_(poll), thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Watchdog& Watchdog::instance() {
  // Leaked on purpose: at exit, libraries whose operations it may still poll
  // (libtorch's NCCL work) are torn down in an order nobody controls.
  static Watchdog* watchdog = new Watchdog();
  return *watchdog;
}

void Watchdog::watch(std::function<bool()> done, std::function<void()> expire, Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.push_back(Entry{std::move(done), std::move(expire), deadline});
  }
  wake_.notify_all();
}

size_t Watchdog::watching() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size() + checking_;
}

int64_t Watchdog::expired() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return expired_;
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (entries_.empty()) {
      wake_.wait(lock, [this] { return stop_ || !entries_.empty(); });
      continue;
    }
    // Checked outside the lock: done() asks the device, expire() aborts a
    // communicator; neither may hold up watch() on the training thread.
    std::vector<Entry> checking;
    checking.swap(entries_);
    checking_ = checking.size();
    lock.unlock();
    const Clock::time_point now = Clock::now();
    std::vector<Entry> pending;
    int64_t expiredNow = 0;
    for (Entry& e : checking) {
      bool finished = false;
      try {
        finished = e.done();
      } catch (...) {
        finished = true;  // a failed operation reports itself when it is waited on
      }
      if (finished) continue;
      if (now >= e.deadline) {
        ++expiredNow;
        try {
          e.expire();
        } catch (...) {
          // The timeout is the news; a failing abort must not end the watchdog.
        }
        continue;
      }
      pending.push_back(std::move(e));
    }
    checking.clear();  // drop the finished operations' captures outside the lock
    lock.lock();
    checking_ = 0;
    expired_ += expiredNow;
    for (Entry& e : pending) entries_.push_back(std::move(e));
    if (!entries_.empty() && !stop_) wake_.wait_for(lock, poll_, [this] { return stop_; });
  }
}

}  // namespace ptrain

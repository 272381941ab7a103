// The watchdog that keeps the deadlines of stream-ordered collectives
// (comm/watchdog.h), with operations whose completion the test controls: an
// operation that completes is forgotten without expiring, one that does not
// expires once, soon after its deadline and not before; a failing probe or
// expiry does not stop it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "ptrain/comm/watchdog.h"

namespace ptrain {
namespace {

using namespace std::chrono_literals;

// Waits up to `limit` for `ready`.
template <typename F>
bool eventually(F ready, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (ready()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return ready();
}

TEST(Watchdog, ForgetsOperationsThatComplete) {
  Watchdog dog(5ms);
  std::atomic<bool> done{false};
  std::atomic<int> expired{0};
  dog.watch([&] { return done.load(); }, [&] { ++expired; }, Watchdog::Clock::now() + 10s);
  EXPECT_EQ(dog.watching(), 1u);
  done = true;
  EXPECT_TRUE(eventually([&] { return dog.watching() == 0; }));
  EXPECT_EQ(expired.load(), 0);
  EXPECT_EQ(dog.expired(), 0);
}

TEST(Watchdog, ExpiresAStuckOperationOnceAfterItsDeadline) {
  Watchdog dog(5ms);
  std::atomic<int> expired{0};
  std::atomic<int64_t> expiredAfterMs{-1};
  const auto start = Watchdog::Clock::now();
  dog.watch([] { return false; },
            [&] {
              expiredAfterMs = std::chrono::duration_cast<std::chrono::milliseconds>(Watchdog::Clock::now() - start)
                                   .count();
              ++expired;
            },
            start + 60ms);
  EXPECT_TRUE(eventually([&] { return expired.load() == 1; }));
  EXPECT_GE(expiredAfterMs.load(), 60);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(expired.load(), 1);  // once
  EXPECT_EQ(dog.watching(), 0u);
  EXPECT_EQ(dog.expired(), 1);
}

TEST(Watchdog, KeepsWatchingAfterAProbeOrAnExpiryThrows) {
  Watchdog dog(5ms);
  dog.watch([]() -> bool { throw std::runtime_error("device lost"); }, [] {}, Watchdog::Clock::now() + 10s);
  dog.watch([] { return false; }, [] { throw std::runtime_error("abort failed"); }, Watchdog::Clock::now());
  EXPECT_TRUE(eventually([&] { return dog.watching() == 0; }));
  std::atomic<int> expired{0};
  dog.watch([] { return false; }, [&] { ++expired; }, Watchdog::Clock::now() + 20ms);
  EXPECT_TRUE(eventually([&] { return expired.load() == 1; }));
}

// Many operations from several threads, half of them stuck: exactly the
// stuck ones expire.
TEST(Watchdog, ManyOperationsFromManyThreads) {
  Watchdog dog(2ms);
  std::atomic<int> expired{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const bool stuck = (i + t) % 2 == 0;
        dog.watch([stuck] { return !stuck; }, [&] { ++expired; }, Watchdog::Clock::now() + 30ms);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(eventually([&] { return dog.watching() == 0; }));
  EXPECT_EQ(expired.load(), 100);
}

}  // namespace
}  // namespace ptrain

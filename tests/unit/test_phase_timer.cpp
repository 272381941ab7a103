// The phase timers (core/phase_timer.h): exclusive times that add up to the
// time measured around them by an independent clock.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "ptrain/core/phase_timer.h"

namespace {

using ptrain::Phase;
using ptrain::PhaseScope;
using Clock = std::chrono::steady_clock;

double at(const ptrain::PhaseSeconds& s, Phase p) { return s[static_cast<size_t>(p)]; }

void sleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(PhaseTimer, NestedScopesPauseTheOuterOneAndAddUpToTheWhole) {
  ptrain::takePhaseSeconds();  // nothing from before
  const auto start = Clock::now();
  {
    PhaseScope outer(Phase::kForwardBackward);
    sleepMs(20);
    {
      PhaseScope inner(Phase::kGradReduce);
      sleepMs(30);
      {
        PhaseScope innermost(Phase::kPipelineWait);
        sleepMs(10);
      }
    }
    sleepMs(5);
  }
  const double whole = std::chrono::duration<double>(Clock::now() - start).count();
  const auto s = ptrain::takePhaseSeconds();
  double sum = 0;
  for (double v : s) sum += v;
  EXPECT_NEAR(sum, whole, 0.002) << "the phases leave out or count twice some of the time";
  EXPECT_GE(at(s, Phase::kGradReduce), 0.030);
  EXPECT_GE(at(s, Phase::kPipelineWait), 0.010);
  EXPECT_GE(at(s, Phase::kForwardBackward), 0.025);
  // The inner scopes' time is not the outer one's.
  EXPECT_LE(at(s, Phase::kForwardBackward), whole - 0.040 + 0.002);
  EXPECT_LE(at(s, Phase::kGradReduce), whole - at(s, Phase::kForwardBackward) - 0.010 + 0.002);
  EXPECT_EQ(at(s, Phase::kOptimizer), 0.0);
  // Taken: the next read starts from zero.
  const auto again = ptrain::takePhaseSeconds();
  for (double v : again) EXPECT_EQ(v, 0.0);
}

TEST(PhaseTimer, AnOpenScopeCountsUpToTheRead) {
  ptrain::takePhaseSeconds();
  PhaseScope open(Phase::kData);
  sleepMs(15);
  const auto s = ptrain::takePhaseSeconds();
  EXPECT_GE(at(s, Phase::kData), 0.015);
  sleepMs(5);
  EXPECT_GE(at(ptrain::takePhaseSeconds(), Phase::kData), 0.005);
}

TEST(PhaseTimer, EachThreadKeepsItsOwnClock) {
  ptrain::takePhaseSeconds();
  std::thread other([] {
    PhaseScope busy(Phase::kOptimizer);
    sleepMs(20);
  });
  other.join();
  EXPECT_EQ(at(ptrain::takePhaseSeconds(), Phase::kOptimizer), 0.0);
}

TEST(PhaseTimer, NamesAreTheMetricsFields) {
  EXPECT_STREQ(ptrain::phaseName(Phase::kForwardBackward), "forward_backward");
  EXPECT_STREQ(ptrain::phaseName(Phase::kGradReduce), "grad_reduce");
  EXPECT_STREQ(ptrain::phaseName(Phase::kPipelineWait), "pipeline_wait");
  EXPECT_STREQ(ptrain::phaseName(Phase::kOther), "other");
}

}  // namespace

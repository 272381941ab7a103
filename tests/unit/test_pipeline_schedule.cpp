// Pipeline schedules, checked against an independent model of their
// execution: a discrete-event simulation of every stage walking its pass list
// with buffered sends, where forward (g, i) waits for forward (g - 1, i) and
// backward (g, i) for backward (g + 1, i). It must never deadlock, its
// makespan must be the textbook one, and the idle / busy ratio per stage must
// equal bubbleFormula(). In-flight counts are counted from the pass lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "ptrain/pipeline/schedule.h"

using namespace ptrain::pipeline;

namespace {

struct Simulation {
  bool deadlocked = false;
  double makespan = 0;
  std::vector<double> busy;  // per stage
};

// Forward passes take tf, backward passes tb, per virtual stage (a chunk is
// 1 / v of the stage's model, so pass times are divided by v).
Simulation simulate(ScheduleKind kind, int p, int v, int m, double tf, double tb) {
  std::vector<std::vector<Pass>> lists;
  for (int r = 0; r < p; ++r) lists.push_back(buildSchedule(kind, p, v, m, r));
  const int lastG = p * v - 1;
  std::map<std::tuple<bool, int, int>, double> finished;  // (forward, g, micro) -> time
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> freeAt(static_cast<size_t>(p), 0);
  Simulation sim;
  sim.busy.assign(static_cast<size_t>(p), 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      auto& list = lists[static_cast<size_t>(r)];
      while (next[static_cast<size_t>(r)] < list.size()) {
        const Pass& pass = list[next[static_cast<size_t>(r)]];
        const int g = pass.chunk * p + r;
        double ready = freeAt[static_cast<size_t>(r)];
        std::tuple<bool, int, int> dep;
        bool hasDep = true;
        if (pass.forward) {
          hasDep = g > 0;
          dep = {true, g - 1, pass.micro};
        } else if (g == lastG) {
          dep = {true, g, pass.micro};
        } else {
          dep = {false, g + 1, pass.micro};
        }
        if (hasDep) {
          auto it = finished.find(dep);
          if (it == finished.end()) break;  // blocked on a receive
          ready = std::max(ready, it->second);
        }
        const double cost = (pass.forward ? tf : tb) / v;
        freeAt[static_cast<size_t>(r)] = ready + cost;
        sim.busy[static_cast<size_t>(r)] += cost;
        finished[{pass.forward, g, pass.micro}] = ready + cost;
        ++next[static_cast<size_t>(r)];
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    if (next[static_cast<size_t>(r)] < lists[static_cast<size_t>(r)].size()) sim.deadlocked = true;
    sim.makespan = std::max(sim.makespan, freeAt[static_cast<size_t>(r)]);
  }
  return sim;
}

void expectEveryPassOnce(const std::vector<Pass>& list, int v, int m) {
  ASSERT_EQ(list.size(), static_cast<size_t>(2 * v * m));
  std::map<std::pair<int, int>, int> state;  // 0 none, 1 forward done, 2 backward done
  for (const Pass& pass : list) {
    int& s = state[{pass.chunk, pass.micro}];
    ASSERT_EQ(s, pass.forward ? 0 : 1) << "chunk " << pass.chunk << " micro " << pass.micro;
    s = pass.forward ? 1 : 2;
  }
  EXPECT_EQ(state.size(), static_cast<size_t>(v * m));
}

// Backward passes of each chunk in micro-batch order: gradients accumulate as
// on a single rank.
void expectBackwardInOrder(const std::vector<Pass>& list) {
  std::map<int, int> nextMicro;
  for (const Pass& pass : list) {
    if (pass.forward) continue;
    EXPECT_EQ(pass.micro, nextMicro[pass.chunk]++);
  }
}

}  // namespace

TEST(PipelineSchedule, OneFOneBMatchesTheTextbookOrder) {
  // Stage 0 of 4 with 6 micro-batches: 3 warm-up forwards, then 1F1B, then drain.
  auto list = buildSchedule(ScheduleKind::kOneFOneB, 4, 1, 6, 0);
  std::string order;
  for (const Pass& p : list) order += (p.forward ? "F" : "B") + std::to_string(p.micro) + " ";
  EXPECT_EQ(order, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  // The last stage alternates from the start.
  list = buildSchedule(ScheduleKind::kOneFOneB, 4, 1, 3, 3);
  order.clear();
  for (const Pass& p : list) order += (p.forward ? "F" : "B") + std::to_string(p.micro) + " ";
  EXPECT_EQ(order, "F0 B0 F1 B1 F2 B2 ");
}

TEST(PipelineSchedule, OneFOneBAndGPipeRunWithoutDeadlockAndWithTheFormulaBubble) {
  for (auto kind : {ScheduleKind::kOneFOneB, ScheduleKind::kGPipe}) {
    for (int p : {1, 2, 3, 4}) {
      for (int m = 1; m <= 9; ++m) {
        SCOPED_TRACE(std::string(toString(kind)) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        for (int r = 0; r < p; ++r) {
          auto list = buildSchedule(kind, p, 1, m, r);
          expectEveryPassOnce(list, 1, m);
          expectBackwardInOrder(list);
          // Activations alive at once: at most p - r for 1F1B, all m for GPipe.
          EXPECT_EQ(maxInFlight(list), kind == ScheduleKind::kGPipe ? m : std::min(p - r, m));
          EXPECT_LE(maxInFlight(list), kind == ScheduleKind::kGPipe ? m : p);
        }
        const double tf = 1, tb = 2;
        Simulation sim = simulate(kind, p, 1, m, tf, tb);
        ASSERT_FALSE(sim.deadlocked);
        EXPECT_NEAR(sim.makespan, (m + p - 1) * (tf + tb), 1e-9);
        for (int r = 0; r < p; ++r) {
          const double idle = sim.makespan - sim.busy[static_cast<size_t>(r)];
          EXPECT_NEAR(idle / sim.busy[static_cast<size_t>(r)], bubbleFormula(kind, p, 1, m), 1e-9);
        }
      }
    }
  }
}

TEST(PipelineSchedule, InterleavedRunsWithoutDeadlockAndShrinksTheBubbleByV) {
  for (int p : {2, 4}) {
    for (int v : {2, 3}) {
      for (int m : {p, 2 * p, 3 * p}) {
        SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m));
        for (int r = 0; r < p; ++r) {
          auto list = buildSchedule(ScheduleKind::kInterleaved, p, v, m, r);
          expectEveryPassOnce(list, v, m);
          expectBackwardInOrder(list);
        }
        const double tf = 1, tb = 2;
        Simulation sim = simulate(ScheduleKind::kInterleaved, p, v, m, tf, tb);
        ASSERT_FALSE(sim.deadlocked);
        const double formula = bubbleFormula(ScheduleKind::kInterleaved, p, v, m);
        EXPECT_DOUBLE_EQ(formula, (p - 1.0) / (v * m));
        if (m > p) {
          // Steady state reached: exactly the interleaved bubble.
          EXPECT_NEAR(sim.makespan, m * (tf + tb) * (1 + formula), 1e-9);
        } else {
          // m == p runs all forwards first: no worse than plain 1F1B.
          EXPECT_LE(sim.makespan, (m + p - 1) * (tf + tb) + 1e-9);
        }
      }
    }
  }
}

TEST(PipelineSchedule, RefusesSizesTheScheduleCannotRun) {
  EXPECT_THROW(buildSchedule(ScheduleKind::kInterleaved, 4, 2, 6, 0), ptrain::ConfigError);  // 6 % 4
  EXPECT_THROW(buildSchedule(ScheduleKind::kInterleaved, 4, 1, 8, 0), ptrain::ConfigError);  // v == 1
  EXPECT_THROW(buildSchedule(ScheduleKind::kOneFOneB, 4, 2, 8, 0), ptrain::ConfigError);     // v > 1
  EXPECT_THROW(buildSchedule(ScheduleKind::kOneFOneB, 4, 1, 8, 4), ptrain::ConfigError);     // rank
  EXPECT_THROW(scheduleFromName("zero-bubble"), ptrain::ConfigError);
  EXPECT_EQ(scheduleFromName("gpipe"), ScheduleKind::kGPipe);
}

TEST(PipelineSchedule, BalancedPartitionSplitsByCost) {
  EXPECT_EQ(balancedPartition({1, 1, 1, 1, 1, 1, 1, 1}, 4), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(balancedPartition({1, 1, 1, 1}, 3), (std::vector<int>{2, 1, 1}));
  EXPECT_EQ(balancedPartition({4, 1, 1, 1, 1}, 2), (std::vector<int>{1, 4}));
  EXPECT_EQ(balancedPartition({3, 3, 1, 1, 1, 1, 1, 1}, 2), (std::vector<int>{2, 6}));
  EXPECT_EQ(balancedPartition({5}, 1), (std::vector<int>{1}));
}

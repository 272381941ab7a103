#include "ptrain/pipeline/schedule.h"

#include <algorithm>
#include <numeric>

namespace ptrain::pipeline {

ScheduleKind scheduleFromName(const std::string& name) {
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  if (name == "gpipe") return ScheduleKind::kGPipe;
  throw ConfigError("parallel.pipeline_schedule: '" + name + "' is not a schedule; use 1f1b, interleaved or gpipe");
}

const char* toString(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
    case ScheduleKind::kGPipe: return "gpipe";
  }
  return "?";
}

namespace {

// Megatron's interleaved order: the k-th forward (or backward) pass of a
// stage works on micro-batch (k / (p v)) * p + k % p of chunk (k % (p v)) / p,
// chunks counted backwards for the backward passes. Every p micro-batches go
// through chunk 0, then chunk 1, ..., so the stage always has work from an
// earlier chunk while the next one's input is still on its way.
Pass interleavedPass(int k, int stages, int chunks, bool forward) {
  const int group = stages * chunks;
  int chunk = (k % group) / stages;
  if (!forward) chunk = chunks - 1 - chunk;
  return Pass{forward, chunk, (k / group) * stages + k % stages};
}

}  // namespace

std::vector<Pass> buildSchedule(ScheduleKind kind, int p, int v, int m, int rank) {
  PTRAIN_CHECK_AS(ConfigError, p >= 1 && m >= 1 && v >= 1 && rank >= 0 && rank < p, "pipeline schedule: stages=", p,
                  ", chunks=", v, ", micro-batches=", m, ", rank=", rank, " are not valid sizes");
  std::vector<Pass> out;
  out.reserve(static_cast<size_t>(2 * m * v));
  if (kind == ScheduleKind::kGPipe || kind == ScheduleKind::kOneFOneB) {
    PTRAIN_CHECK_AS(ConfigError, v == 1, "parallel.pipeline_schedule: ", toString(kind),
                    " runs one model chunk per stage, not virtual_pipeline_model_parallel_size=", v,
                    "; use pipeline_schedule interleaved");
    if (kind == ScheduleKind::kGPipe) {
      for (int i = 0; i < m; ++i) out.push_back(Pass{true, 0, i});
      for (int i = 0; i < m; ++i) out.push_back(Pass{false, 0, i});
      return out;
    }
    const int warmup = std::min(p - rank - 1, m);
    int nextForward = 0, nextBackward = 0;
    for (int i = 0; i < warmup; ++i) out.push_back(Pass{true, 0, nextForward++});
    while (nextForward < m) {
      out.push_back(Pass{true, 0, nextForward++});
      out.push_back(Pass{false, 0, nextBackward++});
    }
    while (nextBackward < m) out.push_back(Pass{false, 0, nextBackward++});
    return out;
  }

  PTRAIN_CHECK_AS(ConfigError, v > 1, "parallel.pipeline_schedule: interleaved needs "
                  "virtual_pipeline_model_parallel_size > 1; use 1f1b");
  PTRAIN_CHECK_AS(ConfigError, m % p == 0, "parallel.pipeline_schedule: interleaved needs the micro-batches per step (",
                  m, ") to be a multiple of pipeline_model_parallel_size=", p);
  const int total = m * v;
  // With m == p every stage runs all forwards first, as Megatron does.
  int warmup = m == p ? total : std::min(total, (p - rank - 1) * 2 + (v - 1) * p);
  int nextForward = 0, nextBackward = 0;
  for (int i = 0; i < warmup; ++i) out.push_back(interleavedPass(nextForward++, p, v, true));
  while (nextForward < total) {
    out.push_back(interleavedPass(nextForward++, p, v, true));
    out.push_back(interleavedPass(nextBackward++, p, v, false));
  }
  while (nextBackward < total) out.push_back(interleavedPass(nextBackward++, p, v, false));
  return out;
}

int maxInFlight(const std::vector<Pass>& passes) {
  int alive = 0, most = 0;
  for (const Pass& pass : passes) {
    alive += pass.forward ? 1 : -1;
    most = std::max(most, alive);
  }
  return most;
}

double bubbleFormula(ScheduleKind kind, int p, int v, int m) {
  const double chunks = kind == ScheduleKind::kInterleaved ? static_cast<double>(v) : 1.0;
  return static_cast<double>(p - 1) / (chunks * static_cast<double>(m));
}

std::vector<int> balancedPartition(const std::vector<int64_t>& costs, int parts) {
  PTRAIN_CHECK(parts >= 1, "balancedPartition: ", parts, " parts");
  const int n = static_cast<int>(costs.size());
  // Fill parts greedily up to `cap`, leaving at least one block for every
  // later part while there are enough; true when the blocks fit.
  auto fill = [&](int64_t cap, std::vector<int>* sizes) {
    std::vector<int> out(static_cast<size_t>(parts), 0);
    int block = 0;
    for (int part = 0; part < parts; ++part) {
      int64_t sum = 0;
      const int partsAfter = parts - part - 1;
      while (block < n && sum + costs[static_cast<size_t>(block)] <= cap &&
             (out[static_cast<size_t>(part)] == 0 || n - block > partsAfter)) {
        sum += costs[static_cast<size_t>(block++)];
        ++out[static_cast<size_t>(part)];
      }
    }
    if (sizes) *sizes = out;
    return block == n;
  };
  int64_t lo = costs.empty() ? 0 : *std::max_element(costs.begin(), costs.end());
  int64_t hi = std::accumulate(costs.begin(), costs.end(), int64_t{0});
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fill(mid, nullptr)) hi = mid;
    else lo = mid + 1;
  }
  std::vector<int> sizes;
  fill(lo, &sizes);
  return sizes;
}

}  // namespace ptrain::pipeline

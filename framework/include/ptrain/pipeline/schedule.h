// Pipeline schedules and stage partitions: which forward and backward passes
// a stage runs in one step, in which order, and which blocks it holds. Pure
// functions, shared by the pipeline plugin, `ptrain check` and the benchmark.
//
// Terms (Megatron-LM's): p stages (pipeline ranks), v model chunks per stage
// (virtual pipeline size), m micro-batches per step and data-parallel rank.
// Chunk c of stage r is virtual stage g = c * p + r: the model's blocks are
// cut into p * v contiguous runs, and activations flow through the virtual
// stages in order, so with v > 1 they visit every stage v times.
//
//  - 1F1B: stage r runs min(p - r - 1, m) warm-up forwards, then alternates
//    one forward and one backward, then drains the remaining backwards. At
//    most p - r micro-batches hold activations at once (GPipe: m).
//  - Interleaved 1F1B (v > 1, m a multiple of p): Megatron's order over the
//    m * v (chunk, micro-batch) passes, in groups of p micro-batches, with
//    (p - r - 1) * 2 + (v - 1) * p warm-up forwards.
//  - GPipe: every forward, then every backward.
// Backward passes of a chunk run in micro-batch order 0..m-1 in every
// schedule, so gradients accumulate in the order a single rank's would.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain::pipeline {

enum class ScheduleKind { kOneFOneB, kInterleaved, kGPipe };

// "1f1b", "interleaved", "gpipe" (parallel.pipeline_schedule); throws
// ConfigError for anything else.
PTRAIN_API ScheduleKind scheduleFromName(const std::string& name);
PTRAIN_API const char* toString(ScheduleKind kind);

struct Pass {
  bool forward = true;
  int chunk = 0;  // model chunk on this stage, 0..v-1
  int micro = 0;  // micro-batch, 0..m-1
  bool operator==(const Pass& o) const { return forward == o.forward && chunk == o.chunk && micro == o.micro; }
};

// The passes stage `rank` runs in one step, in order: every (chunk,
// micro-batch) once forward and once backward. Throws ConfigError when the
// sizes do not fit the schedule (interleaved needs v > 1 and m a multiple of
// p; the others v == 1).
PTRAIN_API std::vector<Pass> buildSchedule(ScheduleKind kind, int stages, int chunks, int microBatches, int rank);

// The most micro-batches (chunk, micro-batch pairs with v > 1) whose
// activations are alive at once: forward done, backward not yet.
PTRAIN_API int maxInFlight(const std::vector<Pass>& passes);

// Idle time over busy time per stage with equal pass times: (p - 1) / m for
// 1F1B and GPipe, (p - 1) / (v * m) for interleaved.
PTRAIN_API double bubbleFormula(ScheduleKind kind, int stages, int chunks, int microBatches);

// Blocks per virtual stage: `parts` contiguous runs of blocks whose largest
// total cost is the smallest possible (costs: e.g. parameters per block);
// among equal splits, the one that puts blocks as early as possible. Equal
// costs and a count that `parts` divides give the even split.
PTRAIN_API std::vector<int> balancedPartition(const std::vector<int64_t>& costs, int parts);

}  // namespace ptrain::pipeline

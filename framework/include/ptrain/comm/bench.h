// Collective benchmarks in the style of nccl-tests, over any ProcessGroup.
//
// For every collective and every message size from min_bytes to max_bytes
// (doubling), each rank times `iters` operations after `warmup` untimed ones,
// then runs one more with known contributions and counts the elements that
// differ from the closed-form expected result. `ptrain bench-comm` prints
// the results as a table; tests and tools may call runCommBench directly.
//
// Size and bandwidth follow nccl-tests: `bytes` is the whole buffer of the
// operation (allreduce/broadcast/send-recv: the tensor; allgather: the
// gathered output; reduce_scatter: the input; all_to_all: the input), algbw
// = bytes / time and busbw = algbw x the collective's factor (allreduce
// 2(n-1)/n, allgather, reduce_scatter and all_to_all (n-1)/n, broadcast and
// send/recv 1), so busbw is comparable with the link speed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ptrain/comm/process_group.h"

namespace ptrain {

struct CommBenchOptions {
  // Collectives to run, from commBenchOps(); empty means all, in that order.
  std::vector<std::string> ops;
  int64_t min_bytes = 1024;
  int64_t max_bytes = 16 << 20;
  int iters = 20;   // timed operations per size, >= 1
  int warmup = 5;   // untimed operations per size, >= 0
  std::string dtype = "float32";  // float32, float64, int32 or int64
  std::string device = "cpu";     // where the buffers live: "cpu", or "cuda:<index>" for NCCL
};

// One row of the table: one collective at one message size.
struct CommBenchResult {
  std::string op;
  int64_t bytes = 0;        // see the header comment
  int64_t count = 0;        // elements in `bytes`
  std::string dtype;
  double time_us = 0;       // mean time per operation on the slowest rank
  double algbw_gbps = 0;    // GB/s (1e9 bytes per second)
  double busbw_gbps = 0;
  int64_t wrong = 0;        // elements that differ from the expected value, summed over ranks
};

// The collectives, in the order they run: allreduce, allgather,
// reduce_scatter, broadcast, all_to_all, sendrecv (a ring: every rank sends
// to the next and receives from the previous), barrier.
PTRAIN_API const std::vector<std::string>& commBenchOps();

// nccl-tests' bus bandwidth factor of `op` on `groupSize` ranks.
PTRAIN_API double commBenchBusFactor(const std::string& op, int groupSize);

// Checks `options` without running anything; throws ConfigError naming the
// option (--ops, --min-bytes, --dtype, ...) when one is invalid.
PTRAIN_API void validateCommBenchOptions(const CommBenchOptions& options);

// Runs the benchmark. Collective: every member of `group` calls it with the
// same options, from one thread. Calls `onResult` (when set) on every rank as
// each row completes, and returns every row; all ranks see the same numbers.
// Operations a group cannot run (send/recv on one rank, or on a backend
// without kSendRecv) are left out. Throws ConfigError for invalid options,
// CommError / TimeoutError when an operation fails.
PTRAIN_API std::vector<CommBenchResult> runCommBench(
    ProcessGroup& group, const CommBenchOptions& options,
    const std::function<void(const CommBenchResult&)>& onResult = nullptr);

}  // namespace ptrain

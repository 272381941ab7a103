// Launching workers: the `ptrain run --nproc` side of a job.
//
// Not part of the plugin SDK: this header belongs to the ptrain_launch
// library, which the ptrain command line links and libptrain_core.so does
// not; a plugin cannot call it. What a worker reads about its own rank is
// in the SDK: comm/rank_env.h.
//
// `ptrain run --nproc N` starts N copies of a worker command on this host with
// torchrun-compatible variables (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, plus GROUP_RANK/NODE_RANK) and
// PTRAIN_WORKER=1. Worker output is forwarded line by line with a "[rank R] "
// prefix. When a worker fails, the others are stopped (SIGTERM, then SIGKILL
// after a grace period) and the launcher returns non-zero, naming the rank and
// its exit code or signal. SIGINT/SIGTERM to the launcher stop every worker.
//
// The same worker code also runs under torchrun, srun or mpirun:
// detectRankEnv() (comm/rank_env.h) reads whichever of their variables are
// present.
// User guide: docs/launching.md.
#pragma once

#include <string>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain {

struct LaunchOptions {
  int nproc_per_node = 1;              // workers on this host, >= 1
  int nnodes = 1;                      // hosts taking part, >= 1
  int node_rank = 0;                   // this host's index in [0, nnodes)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                 // 0: pick a free port (single node only)
  std::vector<std::string> command;    // argv of each worker; command[0] is a path
                                       // (or a name looked up in PATH)
  std::vector<std::string> extra_env;  // "KEY=VALUE" added to every worker
  double grace_seconds = 5;            // SIGTERM -> SIGKILL delay when stopping workers
  // Signals the workers save a checkpoint on (checkpoint.on_signal): when the
  // launcher receives one, it forwards that signal (instead of SIGTERM) and
  // waits save_grace_seconds before SIGKILL. Workers that all exit with
  // kExitStoppedAndSaved (75) make the launcher return 75 too.
  std::vector<int> save_signals;
  double save_grace_seconds = 25;
  // Where the run is recorded for `ptrain doctor` (empty: nowhere): every
  // line the launcher prints, its workers' and its own, appended to
  // log_path; and how each worker ended, written to exit_record_path as
  // {"result": N, "first_failure_rank": R or -1, "launcher_signal": "SIGINT"
  // or null, "ranks": [{"rank": 0, "code": 0, "signal": null}, ...]}.
  std::string log_path;
  std::string exit_record_path;
  bool prefix_output = true;           // "[rank R] " before each line of worker output
  // The workers run ptrain's host kernels (cpu.kernels: ptrain): one thread
  // pool, so OpenMP keeps its default wait (see launch/host_tuning.h).
  bool one_thread_pool = false;
};

// Runs the workers until all exit. Returns 0 when every worker exited 0;
// otherwise the first failing worker's exit code (128 + signal when killed),
// after printing one line to stderr such as "ptrain: rank 2 exited with code
// 3; stopping the other workers" or "ptrain: rank 1 was killed by signal
// SIGSEGV (11); ...". Returns 128 + signal (130 for SIGINT, 143 for SIGTERM,
// 129 for SIGHUP, 138 for SIGUSR1) when the launcher itself is asked to
// stop, unless every worker saved and exited with 75 (save_signals); a second
// such signal skips the grace period. A worker that exits with 75 on its own
// is not a failure.
//
// Each worker gets, on top of the launcher's environment: RANK = node_rank *
// nproc_per_node + local rank, WORLD_SIZE = nnodes * nproc_per_node,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK = NODE_RANK = node_rank,
// GROUP_WORLD_SIZE = nnodes, MASTER_ADDR, MASTER_PORT, PTRAIN_WORKER=1, the
// settings of hostTuning() (launch/host_tuning.h: OMP_WAIT_POLICY, and
// OPENBLAS_CORETYPE where OpenBLAS misjudged the CPU; each note is logged
// once), then extra_env (which wins), and PTRAIN_PROGRESS_TTY=1 for global rank 0 only
// when the launcher's stdout is a terminal (so that one rank alone draws a
// progress bar). Workers read stdin from /dev/null, inherit no descriptor but
// 0-2, run each in its own process group, and get SIGKILL if the launcher
// dies without cleaning up (PR_SET_PDEATHSIG).
//
// Output: each worker's stdout/stderr goes to the launcher's stdout/stderr one
// whole line at a time (a partial line is flushed when the worker's pipe
// closes). Rank 0's lines ending in '\r' pass through as '\r' so a progress
// bar redraws in place; other ranks' '\r' ends a line like '\n'.
//
// Cleanup: when the launcher returns, every worker has been reaped and every
// process left in a worker's process group has been sent SIGKILL; all pipes
// are closed and the previous SIGINT/SIGTERM/SIGHUP/SIGCHLD/SIGPIPE
// dispositions are restored.
//
// Thread: call from one thread at a time (it installs process-wide signal
// handlers for its duration); a second concurrent call throws InternalError.
// Throws: ConfigError for invalid options (nproc_per_node < 1, node_rank out
// of range, empty or non-executable command, master_port 0 with nnodes > 1,
// extra_env entry without '='); Error when the OS refuses to start a worker
// (any already started are stopped first).
PTRAIN_API int launchWorkers(const LaunchOptions& options);

// A TCP port on `host` (a name or numeric address) that is free at the time
// of the call; it may be taken by someone else before it is used.
// Throws ConfigError when `host` cannot be resolved or bound locally.
PTRAIN_API int findFreePort(const std::string& host = "127.0.0.1");

}  // namespace ptrain

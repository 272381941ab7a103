// Launching workers and finding out, inside a worker, which rank it is.
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
// detectRankEnv() reads whichever of their variables are present.
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
// 129 for SIGHUP) when the launcher itself is asked to stop; a second such
// signal skips the grace period.
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

// Where a worker learned its rank.
enum class RankSource { kSingle, kPtrain, kTorchrun, kSlurm, kOpenMpi };
// "single", "ptrain", "torchrun", "slurm" or "openmpi". Static storage.
PTRAIN_API const char* toString(RankSource source);

struct RankEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  RankSource source = RankSource::kSingle;
};

// Reads the rank from the first source present, in order:
//  1. ptrain/torchrun: RANK and WORLD_SIZE (both or neither), LOCAL_RANK,
//     LOCAL_WORLD_SIZE, GROUP_RANK or NODE_RANK, MASTER_ADDR, MASTER_PORT.
//     Source kPtrain when PTRAIN_WORKER=1, else kTorchrun. Missing local
//     variables mean one node (local = global).
//  2. Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE.
//     node_rank = rank / local size (mpirun's default by-slot placement);
//     OMPI_COMM_WORLD_NODE_RANK is not used because it is a per-process rank
//     on the node across jobs, not the node's index.
//  3. Slurm, inside a job step (SLURM_STEP_ID set): SLURM_PROCID,
//     SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, tasks on this node from
//     SLURM_STEP_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE or
//     SLURM_TASKS_PER_NODE ("4(x2),3"); MASTER_ADDR from the environment or
//     the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST.
// MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to 29500 when unset.
// Without any source: a single process (kSingle).
// Throws ConfigError naming the variable for values that are not integers,
// negative, or inconsistent (RANK >= WORLD_SIZE, LOCAL_RANK >=
// LOCAL_WORLD_SIZE, a port outside 1..65535, an MPI job spanning nodes
// without MASTER_ADDR). Thread: reads the environment; do not call while
// another thread calls setenv.
PTRAIN_API RankEnv detectRankEnv();

// True when this process was started as a worker rather than by a user at a
// shell: PTRAIN_WORKER=1, RANK and WORLD_SIZE both set (torchrun),
// OMPI_COMM_WORLD_SIZE set (mpirun), or inside a Slurm step with more than
// one task (SLURM_STEP_ID set and SLURM_NTASKS > 1). Never throws.
PTRAIN_API bool isWorkerProcess();

// Sets libtorch's intra-op threads to max(1, cores / local_world_size), where
// cores are the CPUs this process may run on (sched_getaffinity), and returns
// the number chosen. Call once per process, before the first parallel op.
PTRAIN_API int configureIntraOpThreads(const RankEnv& env);

// A TCP port on `host` (a name or numeric address) that is free at the time
// of the call; it may be taken by someone else before it is used.
// Throws ConfigError when `host` cannot be resolved or bound locally.
PTRAIN_API int findFreePort(const std::string& host = "127.0.0.1");

// The first host name of a Slurm node list: "node[01-04],gpu7" -> "node01",
// "gpu7" -> "gpu7", "rack[2-3]-n[5,7]" -> "rack2-n5". Throws ConfigError for
// an empty list or unbalanced brackets.
PTRAIN_API std::string firstSlurmHost(const std::string& nodelist);

}  // namespace ptrain

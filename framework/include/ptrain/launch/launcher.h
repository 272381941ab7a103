// Launching workers and finding out, inside a worker, which rank it is.
//
// `ptrain run --nproc N` starts N copies of a worker command on this host with
// torchrun-compatible variables (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, plus GROUP_RANK/NODE_RANK) and
// PTRAIN_WORKER=1. Worker output is forwarded line by line with a "[rank R] "
// prefix. When a worker fails, the others are stopped (SIGTERM, then SIGKILL
// after a grace period) and the launcher returns non-zero, naming the rank and
// its exit code or signal. SIGINT/SIGTERM to the launcher stop every worker.
#pragma once

#include <string>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                 // 0: pick a free port (single node only)
  std::vector<std::string> command;    // argv of each worker; command[0] is a path
  std::vector<std::string> extra_env;  // "KEY=VALUE" added to every worker
  double grace_seconds = 5;            // SIGTERM -> SIGKILL delay when stopping workers
  bool prefix_output = true;           // "[rank R] " before each line of worker output
};

// Runs the workers until all exit. Returns 0 when every worker exited 0;
// otherwise the first failing worker's exit code (128 + signal when killed),
// after printing one line such as "ptrain: rank 2 exited with code 3;
// stopped the other workers". Returns 130 after Ctrl-C.
PTRAIN_API int launchWorkers(const LaunchOptions& options);

// Where a worker learned its rank.
enum class RankSource { kSingle, kPtrain, kTorchrun, kSlurm, kOpenMpi };
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

// Reads the rank from, in order: ptrain/torchrun variables (RANK, WORLD_SIZE,
// ...), Open MPI (OMPI_COMM_WORLD_*), Slurm (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, ...; MASTER_ADDR/MASTER_PORT still from the environment or
// the first host of SLURM_JOB_NODELIST). Without any: a single process.
// Throws ConfigError for inconsistent values (e.g. RANK >= WORLD_SIZE).
PTRAIN_API RankEnv detectRankEnv();

// True when this process was started as a worker (by ptrain, torchrun, srun
// with more than one task, or mpirun) rather than by a user at a shell.
PTRAIN_API bool isWorkerProcess();

// Sets libtorch's intra-op threads to max(1, cores / local_world_size) and
// returns the number chosen.
PTRAIN_API int configureIntraOpThreads(const RankEnv& env);

// A TCP port on `host` that is free at the time of the call.
PTRAIN_API int findFreePort(const std::string& host = "127.0.0.1");

}  // namespace ptrain

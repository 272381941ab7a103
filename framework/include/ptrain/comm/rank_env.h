// The rank environment of a worker: which rank this process is, how many
// there are, where rank 0's rendezvous lives, and how many intra-op threads
// this rank may use. A communicator is built from it (comm/communicator.h).
//
// The same worker code runs under `ptrain run --nproc` (launch/launcher.h),
// torchrun, srun or mpirun: detectRankEnv() reads whichever of their
// variables are present. User guide: docs/launching.md.
#pragma once

#include <string>

#include "ptrain/core/error.h"

namespace ptrain {

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
// cores are the CPUs this process may run on (sched_getaffinity), or to
// OMP_NUM_THREADS where that is a whole number from 1 to 4096 (the user's
// choice wins; anything else in it is ignored), and returns the number chosen.
// Call once per process, before the first parallel op.
PTRAIN_API int configureIntraOpThreads(const RankEnv& env);

// The first host name of a Slurm node list: "node[01-04],gpu7" -> "node01",
// "gpu7" -> "gpu7", "rack[2-3]-n[5,7]" -> "rack2-n5". Throws ConfigError for
// an empty list or unbalanced brackets.
PTRAIN_API std::string firstSlurmHost(const std::string& nodelist);

}  // namespace ptrain

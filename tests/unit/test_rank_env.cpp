// detectRankEnv / isWorkerProcess for every launcher ptrain supports, with the
// variables each one really sets; configureIntraOpThreads against `nproc`.
#include <stdlib.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ptrain/comm/rank_env.h"

extern char** environ;

namespace {

using ptrain::ConfigError;
using ptrain::detectRankEnv;
using ptrain::isWorkerProcess;
using ptrain::RankEnv;
using ptrain::RankSource;

bool isLauncherVariable(const std::string& key) {
  static const char* kPlain[] = {"RANK",        "WORLD_SIZE",    "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                 "GROUP_RANK",  "NODE_RANK",     "GROUP_WORLD_SIZE", "MASTER_ADDR",
                                 "MASTER_PORT", "PTRAIN_WORKER", "PTRAIN_PROGRESS_TTY"};
  for (const char* k : kPlain) {
    if (key == k) return true;
  }
  return key.rfind("SLURM_", 0) == 0 || key.rfind("OMPI_", 0) == 0;
}

// Clears every launcher variable for one test (the suite itself may run
// under srun or torchrun) and puts the original environment back afterwards.
class CleanEnv {
 public:
  CleanEnv() {
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry(*e);
      const std::string key = entry.substr(0, entry.find('='));
      if (isLauncherVariable(key)) saved_[key] = entry.substr(key.size() + 1);
    }
    for (const auto& kv : saved_) unsetenv(kv.first.c_str());
  }
  ~CleanEnv() {
    for (const auto& key : touched_) unsetenv(key.c_str());
    for (const auto& kv : saved_) setenv(kv.first.c_str(), kv.second.c_str(), 1);
  }
  CleanEnv(const CleanEnv&) = delete;
  CleanEnv& operator=(const CleanEnv&) = delete;

  CleanEnv& set(const std::string& key, const std::string& value) {
    setenv(key.c_str(), value.c_str(), 1);
    touched_.push_back(key);
    return *this;
  }
  void unset(const std::string& key) { unsetenv(key.c_str()); }

 private:
  std::map<std::string, std::string> saved_;
  std::vector<std::string> touched_;
};

void expectEnv(const RankEnv& e, int rank, int world, int localRank, int localWorld, int node,
               const std::string& addr, int port, RankSource source) {
  EXPECT_EQ(e.rank, rank);
  EXPECT_EQ(e.world_size, world);
  EXPECT_EQ(e.local_rank, localRank);
  EXPECT_EQ(e.local_world_size, localWorld);
  EXPECT_EQ(e.node_rank, node);
  EXPECT_EQ(e.master_addr, addr);
  EXPECT_EQ(e.master_port, port);
  EXPECT_EQ(e.source, source) << ptrain::toString(e.source);
}

// Asserts that detectRankEnv throws ConfigError whose message mentions `what`.
void expectConfigError(const std::string& what) {
  try {
    const RankEnv e = detectRankEnv();
    ADD_FAILURE() << "expected ConfigError mentioning " << what << ", got rank " << e.rank << " of "
                  << e.world_size;
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
  }
}

TEST(RankEnv, NoLauncherMeansASingleProcess) {
  CleanEnv env;
  expectEnv(detectRankEnv(), 0, 1, 0, 1, 0, "127.0.0.1", 29500, RankSource::kSingle);
  EXPECT_FALSE(isWorkerProcess());
}

TEST(RankEnv, PtrainWorkerVariables) {
  CleanEnv env;
  env.set("PTRAIN_WORKER", "1").set("RANK", "5").set("WORLD_SIZE", "8").set("LOCAL_RANK", "1");
  env.set("LOCAL_WORLD_SIZE", "4").set("GROUP_RANK", "1").set("NODE_RANK", "1");
  env.set("MASTER_ADDR", "10.0.0.7").set("MASTER_PORT", "1234");
  expectEnv(detectRankEnv(), 5, 8, 1, 4, 1, "10.0.0.7", 1234, RankSource::kPtrain);
  EXPECT_TRUE(isWorkerProcess());
}

TEST(RankEnv, TorchrunVariables) {
  CleanEnv env;
  env.set("RANK", "3").set("WORLD_SIZE", "4").set("LOCAL_RANK", "1").set("LOCAL_WORLD_SIZE", "2");
  env.set("GROUP_RANK", "1").set("MASTER_ADDR", "node7").set("MASTER_PORT", "29400");
  expectEnv(detectRankEnv(), 3, 4, 1, 2, 1, "node7", 29400, RankSource::kTorchrun);
  EXPECT_TRUE(isWorkerProcess());
}

TEST(RankEnv, HandWrittenEnvInitMeansOneNode) {
  CleanEnv env;
  // PyTorch's env:// needs only these four; local ranks then equal global ones.
  env.set("RANK", "2").set("WORLD_SIZE", "4").set("MASTER_ADDR", "127.0.0.1").set("MASTER_PORT", "6000");
  expectEnv(detectRankEnv(), 2, 4, 2, 4, 0, "127.0.0.1", 6000, RankSource::kTorchrun);
  env.set("NODE_RANK", "0");
  EXPECT_EQ(detectRankEnv().node_rank, 0);
}

TEST(RankEnv, TorchrunWinsOverSchedulerVariables) {
  CleanEnv env;
  // torchrun started inside an srun step: its own variables describe the rank.
  env.set("SLURM_STEP_ID", "0").set("SLURM_PROCID", "0").set("SLURM_NTASKS", "2");
  env.set("OMPI_COMM_WORLD_RANK", "0").set("OMPI_COMM_WORLD_SIZE", "2");
  env.set("RANK", "1").set("WORLD_SIZE", "8").set("LOCAL_RANK", "1").set("LOCAL_WORLD_SIZE", "4");
  expectEnv(detectRankEnv(), 1, 8, 1, 4, 0, "127.0.0.1", 29500, RankSource::kTorchrun);
}

TEST(RankEnv, OpenMpiVariables) {
  CleanEnv env;
  env.set("OMPI_COMM_WORLD_RANK", "5").set("OMPI_COMM_WORLD_SIZE", "8");
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1").set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  // A local rank across all jobs on the node, not the node's index.
  env.set("OMPI_COMM_WORLD_NODE_RANK", "3");
  env.set("MASTER_ADDR", "head").set("MASTER_PORT", "7000");
  // by-slot placement: ranks 4..7 are the second node.
  expectEnv(detectRankEnv(), 5, 8, 1, 4, 1, "head", 7000, RankSource::kOpenMpi);
  EXPECT_TRUE(isWorkerProcess());
}

TEST(RankEnv, OpenMpiOnOneNodeNeedsNoMasterAddr) {
  CleanEnv env;
  env.set("OMPI_COMM_WORLD_RANK", "1").set("OMPI_COMM_WORLD_SIZE", "2");
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1").set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  expectEnv(detectRankEnv(), 1, 2, 1, 2, 0, "127.0.0.1", 29500, RankSource::kOpenMpi);
  // Across nodes rank 0's host must be named.
  env.set("OMPI_COMM_WORLD_SIZE", "4");
  expectConfigError("MASTER_ADDR");
}

TEST(RankEnv, SlurmStepVariables) {
  CleanEnv env;
  env.set("SLURM_STEP_ID", "0").set("SLURM_PROCID", "6").set("SLURM_NTASKS", "8");
  env.set("SLURM_LOCALID", "2").set("SLURM_NODEID", "1").set("SLURM_STEP_TASKS_PER_NODE", "4(x2)");
  env.set("SLURM_JOB_NODELIST", "node[01-04],gpu7");
  expectEnv(detectRankEnv(), 6, 8, 2, 4, 1, "node01", 29500, RankSource::kSlurm);
  EXPECT_TRUE(isWorkerProcess());
  // The step's own node list wins over the job's.
  env.set("SLURM_STEP_NODELIST", "node[03-04]");
  EXPECT_EQ(detectRankEnv().master_addr, "node03");
  // An explicit rendezvous wins over the node list.
  env.set("MASTER_ADDR", "10.1.2.3").set("MASTER_PORT", "4321");
  expectEnv(detectRankEnv(), 6, 8, 2, 4, 1, "10.1.2.3", 4321, RankSource::kSlurm);
}

TEST(RankEnv, SlurmUnevenTasksPerNode) {
  CleanEnv env;
  // 4 + 4 + 3 tasks; this is the third node's second task.
  env.set("SLURM_STEP_ID", "3").set("SLURM_PROCID", "9").set("SLURM_NTASKS", "11");
  env.set("SLURM_LOCALID", "1").set("SLURM_NODEID", "2").set("SLURM_TASKS_PER_NODE", "4(x2),3");
  env.set("SLURM_JOB_NODELIST", "gpu7,node[1-2]");
  expectEnv(detectRankEnv(), 9, 11, 1, 3, 2, "gpu7", 29500, RankSource::kSlurm);
  // A uniform --ntasks-per-node holds for every node.
  env.unset("SLURM_TASKS_PER_NODE");
  env.set("SLURM_NTASKS_PER_NODE", "5");
  env.set("SLURM_PROCID", "6").set("SLURM_NTASKS", "10").set("SLURM_NODEID", "1");
  expectEnv(detectRankEnv(), 6, 10, 1, 5, 1, "gpu7", 29500, RankSource::kSlurm);
}

TEST(RankEnv, SlurmOutsideAStepIsNotARank) {
  CleanEnv env;
  // An sbatch script: the allocation has 8 tasks, but this is one process.
  env.set("SLURM_JOB_ID", "123").set("SLURM_PROCID", "0").set("SLURM_NTASKS", "8");
  env.set("SLURM_JOB_NODELIST", "node[01-02]");
  EXPECT_EQ(detectRankEnv().source, RankSource::kSingle);
  EXPECT_FALSE(isWorkerProcess());
  // `srun --pty bash`: a step with one task is a user at a shell.
  env.set("SLURM_STEP_ID", "0").set("SLURM_NTASKS", "1").set("SLURM_NNODES", "1");
  expectEnv(detectRankEnv(), 0, 1, 0, 1, 0, "node01", 29500, RankSource::kSlurm);
  EXPECT_FALSE(isWorkerProcess());
}

TEST(RankEnv, IsWorkerProcessForEachLauncher) {
  {
    CleanEnv env;
    env.set("PTRAIN_WORKER", "1");
    EXPECT_TRUE(isWorkerProcess());
    env.set("PTRAIN_WORKER", "0");
    EXPECT_FALSE(isWorkerProcess());
  }
  {
    CleanEnv env;
    env.set("RANK", "0");
    EXPECT_FALSE(isWorkerProcess()) << "RANK alone is not a launch";
    env.set("WORLD_SIZE", "1");
    EXPECT_TRUE(isWorkerProcess());
  }
  {
    CleanEnv env;
    env.set("OMPI_COMM_WORLD_SIZE", "1");
    EXPECT_TRUE(isWorkerProcess());
  }
  {
    CleanEnv env;
    env.set("SLURM_STEP_ID", "0").set("SLURM_NTASKS", "2");
    EXPECT_TRUE(isWorkerProcess());
    env.set("SLURM_NTASKS", "lots");
    EXPECT_FALSE(isWorkerProcess()) << "never throws";
  }
}

TEST(RankEnv, InconsistentValuesNameTheVariable) {
  {
    CleanEnv env;
    env.set("RANK", "4").set("WORLD_SIZE", "4");
    expectConfigError("RANK=4");
  }
  {
    CleanEnv env;
    env.set("RANK", "-1").set("WORLD_SIZE", "4");
    expectConfigError("RANK=-1");
  }
  {
    CleanEnv env;
    env.set("RANK", "0").set("WORLD_SIZE", "abc");
    expectConfigError("WORLD_SIZE='abc'");
  }
  {
    CleanEnv env;
    env.set("RANK", "1x").set("WORLD_SIZE", "4");
    expectConfigError("RANK='1x'");
  }
  {
    CleanEnv env;
    env.set("RANK", "0").set("WORLD_SIZE", "0");
    expectConfigError("WORLD_SIZE=0");
  }
  {
    CleanEnv env;
    env.set("RANK", "1").set("WORLD_SIZE", "4").set("LOCAL_RANK", "2").set("LOCAL_WORLD_SIZE", "2");
    expectConfigError("LOCAL_RANK=2");
  }
  {
    CleanEnv env;
    env.set("RANK", "1");
    expectConfigError("WORLD_SIZE");
  }
  {
    CleanEnv env;
    env.set("RANK", "1").set("WORLD_SIZE", "2").set("MASTER_PORT", "70000");
    expectConfigError("MASTER_PORT=70000");
  }
  {
    CleanEnv env;
    env.set("RANK", "1").set("WORLD_SIZE", "2").set("GROUP_RANK", "0").set("NODE_RANK", "1");
    expectConfigError("NODE_RANK=1");
  }
  {
    CleanEnv env;
    env.set("OMPI_COMM_WORLD_RANK", "2").set("OMPI_COMM_WORLD_SIZE", "2");
    expectConfigError("OMPI_COMM_WORLD_RANK=2");
  }
  {
    CleanEnv env;
    env.set("SLURM_STEP_ID", "0").set("SLURM_PROCID", "x").set("SLURM_NTASKS", "2");
    expectConfigError("SLURM_PROCID='x'");
  }
  {
    CleanEnv env;
    env.set("SLURM_STEP_ID", "0").set("SLURM_PROCID", "0").set("SLURM_NTASKS", "2");
    env.set("SLURM_TASKS_PER_NODE", "2(y1)");
    expectConfigError("SLURM_TASKS_PER_NODE='2(y1)'");
  }
  {
    CleanEnv env;
    env.set("SLURM_STEP_ID", "0").set("SLURM_PROCID", "0").set("SLURM_NTASKS", "4").set("SLURM_NODEID", "2");
    env.set("SLURM_STEP_TASKS_PER_NODE", "2,2");
    expectConfigError("SLURM_NODEID=2");
  }
}

TEST(RankEnv, FirstHostOfASlurmNodeList) {
  using ptrain::firstSlurmHost;
  EXPECT_EQ(firstSlurmHost("node[01-04],gpu7"), "node01");
  EXPECT_EQ(firstSlurmHost("gpu7"), "gpu7");
  EXPECT_EQ(firstSlurmHost("gpu7,node[1-2]"), "gpu7");
  EXPECT_EQ(firstSlurmHost("a[007,010-012]"), "a007");
  EXPECT_EQ(firstSlurmHost("rack[2-3]-n[5,7]"), "rack2-n5");
  EXPECT_EQ(firstSlurmHost("n[3]"), "n3");
  EXPECT_EQ(firstSlurmHost("host-1.example.org"), "host-1.example.org");
  EXPECT_THROW(firstSlurmHost(""), ConfigError);
  EXPECT_THROW(firstSlurmHost("node[01-04"), ConfigError);
  EXPECT_THROW(firstSlurmHost("node]1["), ConfigError);
  EXPECT_THROW(firstSlurmHost("node[]"), ConfigError);
}

TEST(RankEnv, SourceNames) {
  EXPECT_STREQ(ptrain::toString(RankSource::kSingle), "single");
  EXPECT_STREQ(ptrain::toString(RankSource::kPtrain), "ptrain");
  EXPECT_STREQ(ptrain::toString(RankSource::kTorchrun), "torchrun");
  EXPECT_STREQ(ptrain::toString(RankSource::kSlurm), "slurm");
  EXPECT_STREQ(ptrain::toString(RankSource::kOpenMpi), "openmpi");
}

// The CPUs this process may use, as coreutils' nproc reports them (it honours
// the affinity mask; OMP_NUM_THREADS would change its answer, so it is unset).
int coresFromNproc() {
  FILE* p = popen("env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc", "r");
  if (p == nullptr) return -1;
  int n = -1;
  if (fscanf(p, "%d", &n) != 1) n = -1;
  pclose(p);
  return n;
}

// Sets (or, with nullopt, unsets) OMP_NUM_THREADS for one scope; the suite
// itself usually runs with OMP_NUM_THREADS=1.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(const std::optional<std::string>& value) {
    if (const char* v = std::getenv("OMP_NUM_THREADS")) saved_ = v;
    if (value) setenv("OMP_NUM_THREADS", value->c_str(), 1);
    else unsetenv("OMP_NUM_THREADS");
  }
  ~ScopedOmpThreads() {
    if (saved_) setenv("OMP_NUM_THREADS", saved_->c_str(), 1);
    else unsetenv("OMP_NUM_THREADS");
  }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  std::optional<std::string> saved_;
};

TEST(RankEnv, IntraOpThreadsAreCoresPerLocalRank) {
  ScopedOmpThreads unset(std::nullopt);
  const int cores = coresFromNproc();
  ASSERT_GT(cores, 0);
  const int before = at::get_num_threads();
  RankEnv one;
  one.local_world_size = 1;
  EXPECT_EQ(ptrain::configureIntraOpThreads(one), cores);
  EXPECT_EQ(at::get_num_threads(), cores);
  RankEnv many;
  many.local_world_size = 64;
  const int expected = cores >= 64 ? cores / 64 : 1;
  EXPECT_EQ(ptrain::configureIntraOpThreads(many), expected);
  EXPECT_EQ(at::get_num_threads(), expected);
  at::set_num_threads(before);
}

// OMP_NUM_THREADS, where it is a whole number, is the count; anything else
// in it leaves the cores-per-rank rule.
TEST(RankEnv, IntraOpThreadsFollowOmpNumThreads) {
  const int before = at::get_num_threads();
  RankEnv many;
  many.local_world_size = 64;
  {
    ScopedOmpThreads three("3");
    EXPECT_EQ(ptrain::configureIntraOpThreads(many), 3);
    EXPECT_EQ(at::get_num_threads(), 3);
  }
  const int cores = coresFromNproc();
  ASSERT_GT(cores, 0);
  for (const char* bad : {"0", "-2", "two", ""}) {
    ScopedOmpThreads ignored(std::string{bad});
    EXPECT_EQ(ptrain::configureIntraOpThreads(many), cores >= 64 ? cores / 64 : 1) << "'" << bad << "'";
  }
  at::set_num_threads(before);
}

}  // namespace

// Rank discovery inside a worker (torchrun/ptrain, Open MPI, Slurm) and the
// per-rank intra-op thread count.
#include <sched.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ptrain/comm/rank_env.h"
#include "ptrain/core/error.h"

namespace ptrain {
namespace {

constexpr int kDefaultMasterPort = 29500;
constexpr const char* kDefaultMasterAddr = "127.0.0.1";

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// Strict: the whole value must be a decimal integer that fits an int, so a
// typo such as RANK=1x is an error instead of silently becoming rank 1.
std::optional<long> toLong(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size() || v < INT_MIN || v > INT_MAX) return std::nullopt;
  // strtol accepts leading blanks; a variable set to " 3" is still a mistake.
  if (s[0] == ' ' || s[0] == '\t' || s[0] == '+') return std::nullopt;
  return v;
}

int parseCount(const char* name, const std::string& value, int minValue) {
  auto v = toLong(value);
  PTRAIN_CHECK_AS(ConfigError, v.has_value(), "environment variable ", name, "='", value,
                  "' is not an integer; set it to a whole number >= ", minValue, " or unset it");
  PTRAIN_CHECK_AS(ConfigError, *v >= minValue, "environment variable ", name, "=", *v,
                  " is out of range; expected a whole number >= ", minValue);
  return static_cast<int>(*v);
}

std::optional<int> optCount(const char* name, int minValue) {
  auto v = env(name);
  if (!v) return std::nullopt;
  return parseCount(name, *v, minValue);
}

int parsePort(const char* name, const std::string& value) {
  int port = parseCount(name, value, 1);
  PTRAIN_CHECK_AS(ConfigError, port <= 65535, "environment variable ", name, "=", port,
                  " is not a TCP port; expected 1..65535");
  return port;
}

void masterFromEnv(RankEnv& out) {
  if (auto a = env("MASTER_ADDR")) {
    PTRAIN_CHECK_AS(ConfigError, !a->empty(),
                    "environment variable MASTER_ADDR is empty; set it to the host of rank 0 or unset it");
    out.master_addr = *a;
  }
  if (auto p = env("MASTER_PORT")) out.master_port = parsePort("MASTER_PORT", *p);
}

void checkConsistent(const RankEnv& e, const char* rankVar, const char* worldVar, const char* localRankVar,
                     const char* localSizeVar) {
  PTRAIN_CHECK_AS(ConfigError, e.rank < e.world_size, "environment variable ", rankVar, "=", e.rank,
                  " must be smaller than ", worldVar, "=", e.world_size, "; fix the launcher's settings");
  PTRAIN_CHECK_AS(ConfigError, e.local_world_size <= e.world_size, "environment variable ", localSizeVar, "=",
                  e.local_world_size, " must not exceed ", worldVar, "=", e.world_size);
  PTRAIN_CHECK_AS(ConfigError, e.local_rank < e.local_world_size, "environment variable ", localRankVar, "=",
                  e.local_rank, " must be smaller than ", localSizeVar, "=", e.local_world_size);
}

RankEnv fromTorchrun() {
  RankEnv out;
  const bool hasRank = env("RANK").has_value();
  const bool hasWorld = env("WORLD_SIZE").has_value();
  PTRAIN_CHECK_AS(ConfigError, hasRank == hasWorld, "environment variable ", hasRank ? "RANK" : "WORLD_SIZE",
                  " is set but ", hasRank ? "WORLD_SIZE" : "RANK",
                  " is not; set both (as torchrun and ptrain run do) or neither");
  out.source = env("PTRAIN_WORKER").value_or("") == "1" ? RankSource::kPtrain : RankSource::kTorchrun;
  out.world_size = parseCount("WORLD_SIZE", *env("WORLD_SIZE"), 1);
  out.rank = parseCount("RANK", *env("RANK"), 0);
  auto localRank = optCount("LOCAL_RANK", 0);
  auto localSize = optCount("LOCAL_WORLD_SIZE", 1);
  // A hand-written launch often sets only RANK/WORLD_SIZE/MASTER_*: that is
  // one node, so local equals global.
  out.local_rank = localRank.value_or(out.rank);
  out.local_world_size = localSize.value_or(out.world_size);
  auto groupRank = optCount("GROUP_RANK", 0);
  auto nodeRank = optCount("NODE_RANK", 0);
  if (groupRank && nodeRank) {
    PTRAIN_CHECK_AS(ConfigError, *groupRank == *nodeRank, "environment variables GROUP_RANK=", *groupRank,
                    " and NODE_RANK=", *nodeRank, " disagree; set them to the same node index");
  }
  out.node_rank = groupRank ? *groupRank : nodeRank.value_or(0);
  masterFromEnv(out);
  checkConsistent(out, "RANK", "WORLD_SIZE", localRank ? "LOCAL_RANK" : "RANK",
                  localSize ? "LOCAL_WORLD_SIZE" : "WORLD_SIZE");
  return out;
}

RankEnv fromOpenMpi() {
  RankEnv out;
  out.source = RankSource::kOpenMpi;
  auto rankStr = env("OMPI_COMM_WORLD_RANK");
  PTRAIN_CHECK_AS(ConfigError, rankStr.has_value(),
                  "environment variable OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not; "
                  "start the workers with mpirun or unset OMPI_COMM_WORLD_SIZE");
  out.world_size = parseCount("OMPI_COMM_WORLD_SIZE", *env("OMPI_COMM_WORLD_SIZE"), 1);
  out.rank = parseCount("OMPI_COMM_WORLD_RANK", *rankStr, 0);
  auto localRank = optCount("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  auto localSize = optCount("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  out.local_rank = localRank.value_or(out.rank);
  out.local_world_size = localSize.value_or(out.world_size);
  checkConsistent(out, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  localRank ? "OMPI_COMM_WORLD_LOCAL_RANK" : "OMPI_COMM_WORLD_RANK",
                  localSize ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "OMPI_COMM_WORLD_SIZE");
  // Open MPI exports no node index (OMPI_COMM_WORLD_NODE_RANK is a local rank
  // across jobs); with mpirun's default by-slot mapping ranks fill one node
  // after another, so the index is rank / ranks-per-node.
  out.node_rank = out.rank / out.local_world_size;
  masterFromEnv(out);
  PTRAIN_CHECK_AS(ConfigError, out.local_world_size == out.world_size || env("MASTER_ADDR").has_value(),
                  "the MPI job spans nodes (OMPI_COMM_WORLD_SIZE=", out.world_size,
                  ", OMPI_COMM_WORLD_LOCAL_SIZE=", out.local_world_size,
                  ") but MASTER_ADDR is not set; pass -x MASTER_ADDR=<host of rank 0> to mpirun");
  return out;
}

// "4(x2),3" -> {4, 4, 3}.
std::vector<int> parseTasksPerNode(const char* name, const std::string& value) {
  std::vector<int> counts;
  size_t pos = 0;
  auto bad = [&]() {
    return ConfigError(detail::concat("environment variable ", name, "='", value,
                                      "' is not a Slurm task list such as 4(x2),3"));
  };
  while (pos <= value.size()) {
    size_t comma = value.find(',', pos);
    std::string item = value.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    long repeat = 1;
    size_t paren = item.find('(');
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') throw bad();
      auto r = toLong(item.substr(paren + 2, item.size() - paren - 3));
      if (!r || *r < 1 || *r > 1'000'000) throw bad();
      repeat = *r;
      item = item.substr(0, paren);
    }
    auto count = toLong(item);
    if (!count || *count < 1) throw bad();
    counts.insert(counts.end(), static_cast<size_t>(repeat), static_cast<int>(*count));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return counts;
}

RankEnv fromSlurm() {
  RankEnv out;
  out.source = RankSource::kSlurm;
  const char* worldVar = env("SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
  auto world = env(worldVar);
  auto rank = env("SLURM_PROCID");
  PTRAIN_CHECK_AS(ConfigError, world && rank,
                  "inside a Slurm step (SLURM_STEP_ID is set) but SLURM_PROCID or SLURM_NTASKS is missing; "
                  "start the workers with srun");
  out.world_size = parseCount(worldVar, *world, 1);
  out.rank = parseCount("SLURM_PROCID", *rank, 0);
  out.node_rank = optCount("SLURM_NODEID", 0).value_or(0);
  auto localRank = optCount("SLURM_LOCALID", 0);
  out.local_rank = localRank.value_or(0);

  // The step's own layout first: a job's per-node counts (SLURM_NTASKS_PER_NODE,
  // SLURM_TASKS_PER_NODE) overstate a step that uses fewer tasks.
  const char* localVar = nullptr;
  if (env("SLURM_STEP_TASKS_PER_NODE")) {
    localVar = "SLURM_STEP_TASKS_PER_NODE";
  } else if (env("SLURM_NTASKS_PER_NODE")) {
    localVar = "SLURM_NTASKS_PER_NODE";
  } else if (env("SLURM_TASKS_PER_NODE")) {
    localVar = "SLURM_TASKS_PER_NODE";
  }
  if (localVar != nullptr) {
    auto counts = parseTasksPerNode(localVar, *env(localVar));
    // SLURM_NTASKS_PER_NODE is a single number that holds for every node.
    size_t index = counts.size() == 1 ? 0 : static_cast<size_t>(out.node_rank);
    PTRAIN_CHECK_AS(ConfigError, index < counts.size(), "environment variable SLURM_NODEID=", out.node_rank,
                    " has no entry in ", localVar, "='", *env(localVar), "'");
    out.local_world_size = counts[index];
  } else {
    int nodes = optCount("SLURM_STEP_NUM_NODES", 1).value_or(optCount("SLURM_NNODES", 1).value_or(1));
    PTRAIN_CHECK_AS(ConfigError, nodes == 1,
                    "the Slurm step spans ", nodes,
                    " nodes but no tasks-per-node variable is set (SLURM_STEP_TASKS_PER_NODE, "
                    "SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE); run it with srun --ntasks-per-node");
    out.local_world_size = out.world_size;
  }
  if (!localRank) out.local_rank = out.rank % out.local_world_size;
  checkConsistent(out, "SLURM_PROCID", worldVar, "SLURM_LOCALID", localVar ? localVar : worldVar);

  if (env("MASTER_ADDR")) {
    masterFromEnv(out);
  } else {
    for (const char* listVar : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (auto list = env(listVar); list && !list->empty()) {
        out.master_addr = firstSlurmHost(*list);
        break;
      }
    }
    if (auto p = env("MASTER_PORT")) out.master_port = parsePort("MASTER_PORT", *p);
  }
  return out;
}

}  // namespace

const char* toString(RankSource source) {
  switch (source) {
    case RankSource::kSingle: return "single";
    case RankSource::kPtrain: return "ptrain";
    case RankSource::kTorchrun: return "torchrun";
    case RankSource::kSlurm: return "slurm";
    case RankSource::kOpenMpi: return "openmpi";
  }
  return "unknown";
}

std::string firstSlurmHost(const std::string& nodelist) {
  auto bad = [&](const char* why) {
    return ConfigError(detail::concat("Slurm node list '", nodelist, "': ", why,
                                      "; expected a form such as node[01-04],gpu7"));
  };
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    char c = nodelist[i];
    if (c == ']') throw bad("']' without '['");
    if (c != '[') {
      host += c;
      ++i;
      continue;
    }
    size_t close = nodelist.find(']', i);
    if (close == std::string::npos) throw bad("'[' without ']'");
    // The first element of "[01-04,07]" is the text before the first '-' or
    // ',': zero padding is part of the host name, so keep it as written.
    std::string inner = nodelist.substr(i + 1, close - i - 1);
    std::string first = inner.substr(0, inner.find_first_of(",-"));
    if (first.empty()) throw bad("empty range");
    host += first;
    i = close + 1;
  }
  if (host.empty()) throw bad("no host");
  return host;
}

RankEnv detectRankEnv() {
  if (env("RANK") || env("WORLD_SIZE")) return fromTorchrun();
  if (env("OMPI_COMM_WORLD_SIZE") || env("OMPI_COMM_WORLD_RANK")) {
    PTRAIN_CHECK_AS(ConfigError, env("OMPI_COMM_WORLD_SIZE").has_value(),
                    "environment variable OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not; "
                    "start the workers with mpirun or unset OMPI_COMM_WORLD_RANK");
    return fromOpenMpi();
  }
  // Outside a step (an sbatch script) SLURM_PROCID=0 and SLURM_NTASKS describe
  // the whole allocation, not this process; only srun makes it a rank.
  if (env("SLURM_STEP_ID")) return fromSlurm();
  RankEnv single;
  masterFromEnv(single);
  return single;
}

bool isWorkerProcess() {
  if (env("PTRAIN_WORKER").value_or("") == "1") return true;
  if (env("RANK") && env("WORLD_SIZE")) return true;
  if (env("OMPI_COMM_WORLD_SIZE")) return true;
  if (env("SLURM_STEP_ID")) {
    auto tasks = env("SLURM_NTASKS");
    if (!tasks) tasks = env("SLURM_NPROCS");
    if (tasks) {
      auto n = toLong(*tasks);
      return n && *n > 1;
    }
  }
  return false;
}

int configureIntraOpThreads(const RankEnv& rankEnv) {
  // The user's own count wins, as in PyTorch: OMP_NUM_THREADS=1 pins every
  // rank to one thread whatever the host has.
  if (auto requested = env("OMP_NUM_THREADS")) {
    const auto n = toLong(*requested);
    if (n && *n >= 1 && *n <= 4096) {
      at::set_num_threads(static_cast<int>(*n));
      return static_cast<int>(*n);
    }
  }
  int cores = 0;
  // The affinity mask, not the machine: under taskset, cgroups cpusets or
  // Slurm's --cpus-per-task a rank may only use part of the host.
  for (int maxCpus = 1024; maxCpus <= (1 << 16) && cores == 0; maxCpus *= 4) {
    cpu_set_t* set = CPU_ALLOC(maxCpus);
    if (set == nullptr) break;
    size_t size = CPU_ALLOC_SIZE(maxCpus);
    CPU_ZERO_S(size, set);
    if (sched_getaffinity(0, size, set) == 0) {
      cores = CPU_COUNT_S(size, set);
    } else if (errno != EINVAL) {
      CPU_FREE(set);
      break;
    }
    CPU_FREE(set);
  }
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  const int threads = std::max(1, cores / std::max(1, rankEnv.local_world_size));
  at::set_num_threads(threads);
  return threads;
}

}  // namespace ptrain

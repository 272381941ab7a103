// ptrain run: validate the recipe, prepare the run folder, start the workers;
// inside a worker, train.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "ptrain/comm/nccl_settings.h"
#include "ptrain/comm/rank_env.h"
#include "ptrain/core/host_allocator.h"
#include "ptrain/core/logging.h"
#include "ptrain/core/resources.h"
#include "ptrain/nn/host_kernels.h"
#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/engine/engine.h"
#include "ptrain/engine/offload.h"
#include "ptrain/launch/launcher.h"

namespace fs = std::filesystem;

namespace ptrain::cli {
namespace {

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// Workers started by another launcher agree on a folder without talking.
std::string jobId() {
  for (const char* var : {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_orte_ess_jobid", "MASTER_PORT"}) {
    if (const char* v = std::getenv(var)) return v;
  }
  return "0";
}

std::string selfExe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "ptrain" : p.string();
}

std::string formatBytes(double bytes) {
  char buf[32];
  if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  else std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  return buf;
}

void printSummary(const TrainSummary& s, const std::string& runDir) {
  std::printf("\n  %-22s %s\n", "run folder", runDir.c_str());
  std::printf("  %-22s %lld\n", "steps", static_cast<long long>(s.steps));
  std::printf("  %-22s %.4f\n", "final loss", s.final_loss);
  for (const auto& [k, v] : s.eval) std::printf("  %-22s %.4f\n", k.c_str(), v);
  std::printf("  %-22s %.0f\n", (s.throughput_unit + "/s").c_str(), s.tokens_per_s);
  std::printf("  %-22s %.1f s\n", "start-up", s.startup_s);
  if (!s.peak_rss_mb_ranks.empty()) {
    const auto most = std::max_element(s.peak_rss_mb_ranks.begin(), s.peak_rss_mb_ranks.end());
    std::printf("  %-22s %.0f MB (rank %lld, the most of any)\n", "peak memory", *most,
                static_cast<long long>(most - s.peak_rss_mb_ranks.begin()));
  }
  if (s.checkpoint_saves > 0) {
    std::printf("  %-22s %lld, %.1f s and %s a save (slowest rank, all ranks' bytes)\n", "checkpoints saved",
                static_cast<long long>(s.checkpoint_saves), s.checkpoint_save_s / s.checkpoint_saves,
                formatBytes(s.checkpoint_save_bytes / s.checkpoint_saves).c_str());
  }
  if (s.checkpoint_load_s > 0) {
    std::printf("  %-22s %.1f s, %s read (slowest rank, all ranks' bytes)\n", "checkpoint loaded",
                s.checkpoint_load_s, formatBytes(s.checkpoint_load_bytes).c_str());
  }
  std::printf("  %-22s %.1f s\n", "wall time", s.wall_s);
  std::fflush(stdout);
}

int runWorker(const RunArgs& args) {
  RankEnv env = detectRankEnv();
  initLogging(env.rank, env.world_size, "info");
  configureIntraOpThreads(env);
  PreparedRecipe prepared = prepareRecipe(args.recipe, args.overrides, env.world_size, env.rank);
  initLogging(env.rank, env.world_size, prepared.recipe.getString("log.level"));
  if (prepared.recipe.getString("cpu.allocator") == "caching") installCachingHostAllocator();
  nn::setHostKernels(prepared.recipe.getString("cpu.kernels") == "ptrain");
  EngineOptions options;
  options.resume = args.resume;
  options.run_dir = args.run_dir.empty() ? "runs/" + prepared.recipe.name() + "/job-" + jobId() : args.run_dir;
  if (env.rank == 0) fs::create_directories(options.run_dir);
  TrainSummary summary = train(prepared, env, options);
  if (env.rank == 0) printSummary(summary, options.run_dir);
  return 0;
}

}  // namespace

int cmdRun(const RunArgs& args) {
  if (isWorkerProcess()) return runWorker(args);
  // The workers measure their start-up from here (metrics' startup_s).
  char launched[32];
  std::snprintf(launched, sizeof launched, "%.3f",
                std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());

  const int nnodes = args.launch.nnodes;
  // Everything a worker would refuse is refused here first, before any
  // folder is made or process started.
  // --nproc wins over the recipe's launch.nproc.
  // `parallel: auto` is chosen here, once, and handed to every worker as
  // overrides (the workers never search).
  std::vector<std::string> overrides = args.overrides;
  std::string chosen;
  const int requestedWorld = args.launch.nproc > 0 ? args.launch.nproc * nnodes : 0;
  for (auto& o : autoLayoutOverrides(args.recipe, args.overrides, requestedWorld, nnodes, &chosen)) {
    overrides.push_back(std::move(o));
  }
  if (!chosen.empty()) logger()->info("{}", chosen);
  PreparedRecipe prepared = prepareRecipe(args.recipe, overrides, requestedWorld);
  const int nproc = args.launch.nproc > 0 ? args.launch.nproc : prepared.world_size / nnodes;

  std::string runDir = args.run_dir;
  {
    // The disk tier writes under the run folder: a folder it cannot write is
    // refused before any folder is made or worker started.
    const auto problems = checkOffloadFolder(prepared.recipe, runDir);
    if (!problems.empty()) throw ConfigError(problems.front());
  }
  if (args.resume) {
    if (runDir.empty()) throw ConfigError("--resume needs --run-dir DIR: the folder of the run to continue");
    if (!fs::is_directory(runDir)) throw CheckpointError(runDir + ": run folder not found: nothing to resume");
    if (!latestCheckpoint(runDir)) {
      throw CheckpointError(runDir + ": no checkpoint to resume from (" + (fs::path(runDir) / "checkpoints").string() +
                            " holds no complete step_N folder)");
    }
  } else {
    if (runDir.empty()) runDir = (fs::path("runs") / prepared.recipe.name() / timestamp()).string();
    if (fs::is_directory(runDir) && latestCheckpoint(runDir)) {
      throw ConfigError(runDir + " already holds checkpoints: add --resume to continue that run, or choose another "
                        "--run-dir");
    }
    if (args.launch.node_rank == 0) {
      fs::create_directories(runDir);
      // The recipe as written (files and overrides): `ptrain run` loads it
      // again as it loaded the original (the doctor's suggested commands use
      // it). Every resolved value is in each checkpoint's meta.json.
      std::ofstream(fs::path(runDir) / "recipe.yaml") << prepared.recipe.toYaml(Recipe::Values::kWritten);
    }
  }

  LaunchOptions launch;
  launch.nproc_per_node = nproc;
  launch.nnodes = nnodes;
  launch.node_rank = args.launch.node_rank;
  if (!args.launch.master_addr.empty()) launch.master_addr = args.launch.master_addr;
  launch.master_port = args.launch.master_port;
  launch.one_thread_pool = prepared.recipe.getString("cpu.kernels") == "ptrain";
  // communication.nccl: the workers start with the recipe's NCCL variables
  // that this environment does not set itself (each worker checks again, a
  // no-op then; a worker started by torchrun or srun sets them on its own).
  const auto ncclSettings =
      nccl::effectiveSettings(nccl::settingsFromRecipe(prepared.recipe), nccl::processEnvironment());
  for (const auto& setting : ncclSettings) logger()->info("{}", nccl::headerLine(setting));
  launch.extra_env = nccl::environmentEntries(ncclSettings);
  launch.extra_env.push_back(std::string(kLaunchTimeVariable) + "=" + launched);
  // What `ptrain doctor RUN_DIR` reads: the whole output and how each worker
  // ended (one pair per node when there are several).
  const std::string node = nnodes > 1 ? ".node" + std::to_string(args.launch.node_rank) : "";
  fs::create_directories(runDir);
  launch.log_path = (fs::path(runDir) / ("launch" + node + ".log")).string();
  launch.exit_record_path = (fs::path(runDir) / ("exit" + node + ".json")).string();
  launch.command = {selfExe(), "run", args.recipe};
  for (const auto& o : overrides) launch.command.push_back(o);
  launch.command.push_back("--run-dir");
  launch.command.push_back(runDir);
  if (args.resume) launch.command.push_back("--resume");
  return launchWorkers(launch);
}

}  // namespace ptrain::cli

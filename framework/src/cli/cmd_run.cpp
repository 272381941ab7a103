// ptrain run: validate the recipe, prepare the run folder, start the workers;
// inside a worker, train.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "ptrain/comm/nccl_settings.h"
#include "ptrain/comm/rank_env.h"
#include "ptrain/core/device.h"
#include "ptrain/core/host_allocator.h"
#include "ptrain/core/logging.h"
#include "ptrain/core/resources.h"
#include "ptrain/nn/host_kernels.h"
#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/engine/engine.h"
#include "ptrain/engine/offload.h"
#include "ptrain/launch/launcher.h"
#include "ptrain/launch/run_lock.h"
#include "ptrain/plan/cost_model.h"

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
  if (s.mfu >= 0) std::printf("  %-22s %.1f%%\n", "MFU", 100 * s.mfu);
  std::printf("  %-22s %.1f s\n", "start-up", s.startup_s);
  if (s.step_time_s > 0) {
    // Where the steps' time went, largest first (rank 0's clocks).
    std::vector<std::pair<double, std::string>> phases;
    for (const auto& [name, seconds] : s.phase_s)
      if (seconds > 0) phases.emplace_back(seconds, name);
    std::sort(phases.rbegin(), phases.rend());
    std::string shares;
    for (const auto& [seconds, name] : phases) {
      char part[96];
      std::snprintf(part, sizeof part, "%s%s %.1f%%", shares.empty() ? "" : ", ", name.c_str(),
                    100 * seconds / s.step_time_s);
      shares += part;
    }
    std::printf("  %-22s %.1f s: %s\n", "step time", s.step_time_s, shares.c_str());
  }
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

bool isFile(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// The recipe a resumed run was started with.
std::string savedRecipe(const std::string& runDir) { return (fs::path(runDir) / "recipe.yaml").string(); }

// "step_N" names of a run's checkpoints, for messages.
std::string stepList(const std::vector<int64_t>& steps) {
  std::string out;
  for (int64_t s : steps) out += (out.empty() ? "" : ", ") + std::string("step_") + std::to_string(s);
  return out.empty() ? "none" : out;
}

// A resume with another recipe (--allow-changes) keeps what the run was
// beside what it becomes: RUN_DIR/recipe.yaml is copied to
// recipe.before-step_N.yaml, then replaced by the new recipe, each file
// written whole. Rank 0 calls it once checkpoint N has loaded, so a refused
// resume leaves the folder as it was.
void recordRecipeChanges(const std::string& runDir, int64_t step, const PreparedRecipe& prepared) {
  const std::string saved = savedRecipe(runDir);
  if (!isFile(saved) || recipeChanges(saved, prepared).empty()) return;
  std::ifstream in(saved, std::ios::binary);
  std::stringstream before;
  before << in.rdbuf();
  writeFileAtomically((fs::path(runDir) / ("recipe.before-step_" + std::to_string(step) + ".yaml")).string(),
                      before.str());
  writeFileAtomically(saved, prepared.recipe.toYaml(Recipe::Values::kWritten));
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
  // MFU's denominator on a GPU: the plan's table's peak of this card in the
  // run's precision.
  if (prepared.recipe.getString("device.type") != "cpu" && cudaDeviceCount() > env.local_rank) {
    if (const plan::DeviceSpec* card =
            plan::presetForCudaDevice(cudaDeviceName(env.local_rank), cudaDeviceMemoryGib(env.local_rank))) {
      const std::string precision = prepared.recipe.getString("precision.name");
      const bool half = precision == "bf16" || precision == "fp16";
      options.device_peak_flops = 1e12 * (half ? card->peak_tflops_half : card->peak_tflops_fp32);
    }
  }
  options.run_dir = args.run_dir.empty() ? "runs/" + prepared.recipe.name() + "/job-" + jobId() : args.run_dir;
  if (args.resume && args.allow_changes) {
    options.on_resumed = [&prepared, runDir = options.run_dir](int64_t step) {
      recordRecipeChanges(runDir, step, prepared);
    };
  }
  // One writer per run folder: `ptrain run`'s launcher holds the lock and
  // says so; under another launcher (torchrun, srun) rank 0 takes it.
  std::unique_ptr<RunFolderLock> lock;
  if (env.rank == 0) {
    const char* held = std::getenv(kRunLockHeldVariable);
    if (held == nullptr || options.run_dir != held) lock = std::make_unique<RunFolderLock>(options.run_dir);
    if (args.resume && args.from_step >= 0) setAsideCheckpointsAfter(options.run_dir, args.from_step);
  }
  TrainSummary summary;
  try {
    summary = train(prepared, env, options);
  } catch (const Error& e) {
    // Every rank reaches these together with the same words: rank 0 says
    // them once.
    const bool shared = dynamic_cast<const NonFiniteError*>(&e) != nullptr ||
                        dynamic_cast<const StoppedBySignal*>(&e) != nullptr;
    if (shared && env.rank != 0) return e.exitCode();
    throw;
  }
  if (env.rank == 0) printSummary(summary, options.run_dir);
  return 0;
}

}  // namespace

int cmdRun(const RunArgs& argsIn) {
  RunArgs args = argsIn;
  // `ptrain run --resume --run-dir D train.steps=50`: the first override is
  // not a recipe file.
  if (!args.recipe.empty() && args.recipe.find('=') != std::string::npos && !isFile(args.recipe)) {
    args.overrides.insert(args.overrides.begin(), args.recipe);
    args.recipe.clear();
  }
  if (isWorkerProcess()) {
    // A worker of another launcher (torchrun, srun) resumes with the run's
    // own recipe too.
    if (args.recipe.empty() && args.resume && !args.run_dir.empty()) args.recipe = savedRecipe(args.run_dir);
    return runWorker(args);
  }
  // The workers measure their start-up from here (metrics' startup_s).
  char launched[32];
  std::snprintf(launched, sizeof launched, "%.3f",
                std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());

  if (!args.resume && (args.from_step >= 0 || args.allow_changes)) {
    throw ConfigError(std::string(args.from_step >= 0 ? "--from-step" : "--allow-changes") +
                      " belongs to --resume: add --resume --run-dir DIR to continue that run");
  }
  std::string runDir = args.run_dir;
  if (!runDir.empty() && fs::exists(runDir) && !fs::is_directory(runDir)) {
    throw ConfigError("--run-dir " + runDir + " is a file, not a folder: give a folder (it is created if missing)");
  }
  // A resumed run takes its own recipe unless told otherwise.
  bool givenRecipe = !args.recipe.empty();
  if (args.resume) {
    if (runDir.empty()) throw ConfigError("--resume needs --run-dir DIR: the folder of the run to continue");
    if (!fs::is_directory(runDir)) throw CheckpointError(runDir + ": run folder not found: nothing to resume");
    if (!givenRecipe) {
      if (!isFile(savedRecipe(runDir))) {
        throw ConfigError(savedRecipe(runDir) + " not found: give the recipe the run was started with");
      }
      args.recipe = savedRecipe(runDir);
    }
  } else if (!givenRecipe) {
    throw ConfigError("ptrain run: give a recipe file (ptrain run RECIPE), or --resume --run-dir DIR to continue a run");
  }

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
  {
    const std::string overMemory = hostMemoryRefusal(args.recipe, prepared);
    if (!overMemory.empty()) throw OutOfMemoryError(overMemory);
  }

  {
    // The disk tier writes under the run folder: a folder it cannot write is
    // refused before any folder is made or worker started.
    const auto problems = checkOffloadFolder(prepared.recipe, runDir);
    if (!problems.empty()) throw ConfigError(problems.front());
  }
  if (!args.resume && runDir.empty()) runDir = (fs::path("runs") / prepared.recipe.name() / timestamp()).string();

  // One writer per run folder, from here until the workers have ended
  // (node 0's launcher; the others write into the same folder only through
  // their workers, which rank 0's lock covers).
  std::unique_ptr<RunFolderLock> lock;
  if (args.launch.node_rank == 0) lock = std::make_unique<RunFolderLock>(runDir);

  if (args.resume) {
    const auto steps = listCheckpoints(runDir);
    if (steps.empty()) {
      throw CheckpointError(runDir + ": no checkpoint to resume from (" + (fs::path(runDir) / "checkpoints").string() +
                            " holds no complete step_N folder)");
    }
    int64_t from = steps.back();
    if (args.from_step >= 0) {
      if (std::find(steps.begin(), steps.end(), args.from_step) == steps.end()) {
        throw CheckpointError(detail::concat(runDir, ": --from-step ", args.from_step, ": no complete checkpoint step_",
                                             args.from_step, " there; it has ", stepList(steps)));
      }
      from = args.from_step;
    }
    // A recipe other than the run's is a decision, not an accident.
    const bool differs = givenRecipe || !args.overrides.empty();
    std::vector<std::string> changes;
    if (differs && isFile(savedRecipe(runDir))) changes = recipeChanges(savedRecipe(runDir), prepared);
    if (!changes.empty() && !args.allow_changes) {
      std::string text = runDir + ": the recipe differs from the run's (" + savedRecipe(runDir) + ") in " +
                         std::to_string(changes.size()) + (changes.size() == 1 ? " key" : " keys") +
                         "; add --allow-changes to resume with it, or drop the recipe and overrides to resume as "
                         "the run was:";
      for (const auto& c : changes) text += "\n  " + c;
      throw ConfigError(text);
    }
    const int64_t steps_ = prepared.recipe.getInt("train.steps");
    if (from >= steps_) {
      std::printf("%s: the run has finished: checkpoint step_%lld is at train.steps=%lld, so there is nothing to "
                  "resume; to train further, raise it: ptrain run --resume --run-dir %s train.steps=N "
                  "--allow-changes\n",
                  runDir.c_str(), static_cast<long long>(from), static_cast<long long>(steps_), runDir.c_str());
      return 0;
    }
    if (args.launch.node_rank == 0) {
      for (const auto& c : changes) logger()->info("resuming with a change: {}", c);
      if (args.from_step >= 0) {
        for (const auto& moved : setAsideCheckpointsAfter(runDir, from)) {
          logger()->info("resuming from step_{}: {} set aside (not resumable; remove it when not needed)", from, moved);
        }
      }
    }
  } else {
    if (latestCheckpoint(runDir)) {
      throw ConfigError(runDir + " already holds checkpoints: add --resume to continue that run, or choose another "
                        "--run-dir");
    }
    if (args.launch.node_rank == 0) {
      // The recipe as written (files and overrides): `ptrain run` loads it
      // again as it loaded the original (the doctor's suggested commands use
      // it, and so does --resume without a recipe). Every resolved value is
      // in each checkpoint's meta.json.
      writeFileAtomically(savedRecipe(runDir), prepared.recipe.toYaml(Recipe::Values::kWritten));
    }
  }

  LaunchOptions launch;
  launch.nproc_per_node = nproc;
  launch.nnodes = nnodes;
  launch.node_rank = args.launch.node_rank;
  if (!args.launch.master_addr.empty()) launch.master_addr = args.launch.master_addr;
  launch.master_port = args.launch.master_port;
  launch.one_thread_pool = prepared.recipe.getString("cpu.kernels") == "ptrain";
  // checkpoint.on_signal: these signals reach every worker, which saves at
  // its next step boundary; the launcher waits signal_grace_s for that.
  for (const auto& name : prepared.recipe.getStringList("checkpoint.on_signal")) {
    launch.save_signals.push_back(stopSignalNumber(name));
  }
  launch.save_grace_seconds = prepared.recipe.getFloat("checkpoint.signal_grace_s");
  // communication.nccl: the workers start with the recipe's NCCL variables
  // that this environment does not set itself (each worker checks again, a
  // no-op then; a worker started by torchrun or srun sets them on its own).
  const auto ncclSettings =
      nccl::effectiveSettings(nccl::settingsFromRecipe(prepared.recipe), nccl::processEnvironment());
  for (const auto& setting : ncclSettings) logger()->info("{}", nccl::headerLine(setting));
  launch.extra_env = nccl::environmentEntries(ncclSettings);
  launch.extra_env.push_back(std::string(kLaunchTimeVariable) + "=" + launched);
  if (lock) launch.extra_env.push_back(std::string(kRunLockHeldVariable) + "=" + runDir);
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
  // The workers record the changed recipe once they have loaded the checkpoint.
  if (args.resume && args.allow_changes) launch.command.push_back("--allow-changes");
  return launchWorkers(launch);
}

}  // namespace ptrain::cli

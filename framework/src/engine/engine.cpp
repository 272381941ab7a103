#include "ptrain/engine/engine.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <torch/torch.h>

#include "engine/checkpointer.h"
#include "engine/progress.h"
#include "engine/step_profiler.h"
#include "engine/tensorboard_writer.h"
#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/comm/communicator.h"
#include "ptrain/comm/nccl_settings.h"
#include "ptrain/comm/store.h"
#include "ptrain/core/logging.h"
#include "ptrain/core/phase_timer.h"
#include "ptrain/core/resources.h"
#include "ptrain/core/text.h"
#include "ptrain/core/device.h"
#include "ptrain/engine/op_counter.h"
#include "ptrain/engine/recipe_layout.h"
#include "ptrain/layout/device_groups.h"
#include "ptrain/engine/trainer.h"
#include "ptrain/engine/weights_source.h"
#include "ptrain/plugin/registry.h"

namespace fs = std::filesystem;

namespace ptrain {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// "  scale 65536  skipped 2" for a step under a loss scale, "" otherwise.
std::string scaleNote(const StepResult& result) {
  auto scale = result.stats.find("loss_scale");
  if (scale == result.stats.end()) return "";
  auto skipped = result.stats.find("skipped_steps");
  return "  scale " + text::formatNumber(scale->second) + "  skipped " +
         text::formatNumber(skipped == result.stats.end() ? 0.0 : skipped->second);
}

// The first of checkpoint.on_signal's signals this process received (0:
// none). Set by the handler, read at step boundaries.
volatile sig_atomic_t gStopSignal = 0;
extern "C" void onStopSignal(int sig) {
  if (gStopSignal == 0) gStopSignal = sig;
}

struct NamedSignal {
  const char* name;
  int number;
};
constexpr NamedSignal kStopSignals[] = {
    {"SIGTERM", SIGTERM}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGINT", SIGINT}, {"SIGHUP", SIGHUP}};

std::string signalName(int number) {
  for (const auto& s : kStopSignals)
    if (s.number == number) return s.name;
  return "signal " + std::to_string(number);
}

// Handlers installed for a session's life, and the dispositions they replaced.
std::vector<std::pair<int, struct sigaction>> gSavedActions;

void installStopHandlers(const std::vector<int>& signals) {
  gStopSignal = 0;
  struct sigaction sa {};
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : signals) {
    struct sigaction old {};
    if (sigaction(sig, &sa, &old) == 0) gSavedActions.emplace_back(sig, old);
  }
}

void restoreStopHandlers() {
  for (auto& [sig, old] : gSavedActions) sigaction(sig, &old, nullptr);
  gSavedActions.clear();
}

}  // namespace

int stopSignalNumber(const std::string& name) {
  for (const auto& s : kStopSignals)
    if (name == s.name) return s.number;
  return 0;
}

std::vector<std::string> checkProfileSteps(const Recipe& recipe) {
  std::vector<std::string> problems;
  if (!recipe.has("log.profile_steps")) return problems;
  const auto window = recipe.getIntList("log.profile_steps");
  if (window.empty()) return problems;
  const int64_t steps = recipe.getInt("train.steps");
  const std::string where = recipe.location("log.profile_steps").str() + ": log.profile_steps: ";
  if (window.size() != 2) {
    problems.push_back(where + "expected [A, B], the first and last training step to trace (e.g. [10, 12]), or [] "
                               "for none; got " + std::to_string(window.size()) + " numbers");
  } else if (window[0] < 1 || window[0] > window[1] || window[1] > steps) {
    problems.push_back(where + "[" + std::to_string(window[0]) + ", " + std::to_string(window[1]) +
                       "] is not a window of this run's steps: expected 1 <= A <= B <= train.steps (" +
                       std::to_string(steps) + ")");
  }
  return problems;
}

std::vector<std::string> checkStopSignals(const Recipe& recipe) {
  std::vector<std::string> problems;
  if (!recipe.has("checkpoint.on_signal")) return problems;
  for (const auto& name : recipe.getStringList("checkpoint.on_signal")) {
    if (stopSignalNumber(name) == 0) {
      problems.push_back(recipe.location("checkpoint.on_signal").str() + ": checkpoint.on_signal: '" + name +
                         "' is not a signal ptrain saves on; expected any of SIGTERM, SIGUSR1, SIGUSR2, SIGINT, "
                         "SIGHUP, or [] for none");
    }
  }
  return problems;
}

// Rank 0's record of the run: metrics.jsonl and, under log.tensorboard, the
// same rows as TensorBoard scalars.
struct TrainingSession::Metrics {
  explicit Metrics(const std::string& path) : writer(path) {}
  MetricsWriter writer;
  std::unique_ptr<TensorBoardWriter> tensorboard;

  void write(const std::string& kind, nlohmann::json row) {
    const double time = epochNow();
    row["kind"] = kind;
    row["time"] = time;
    writer.write(row);
    if (tensorboard == nullptr) return;
    try {
      writeScalars(kind, row, time);
    } catch (const std::exception& e) {
      // A full disk must not end the run: metrics.jsonl has every row.
      logger()->warn("log.tensorboard: {}; no more TensorBoard events are written (metrics.jsonl goes on)", e.what());
      tensorboard.reset();
    }
  }

  void writeScalars(const std::string& kind, const nlohmann::json& row, double time) {
    const int64_t step = row.value("step", int64_t{0});
    for (const auto& [field, value] : row.items()) {
      if (field == "step" || field == "time" || field == "kind") continue;
      const std::string tag = kind + "/" + field;
      if (value.is_number() || value.is_boolean()) {
        tensorboard->scalar(tag, step, value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>(), time);
      } else if (value.is_array()) {
        for (size_t r = 0; r < value.size(); ++r)
          if (value[r].is_number()) tensorboard->scalar(tag + "/rank" + std::to_string(r), step, value[r].get<double>(), time);
      }
    }
    tensorboard->flush();
  }
};

TrainingSession::TrainingSession(PreparedRecipe& prepared, const RankEnv& env, EngineOptions options)
    : prepared_(prepared), env_(env), options_(std::move(options)) {
  const Recipe& recipe = prepared_.recipe;
  device_ = selectDevice(recipe.getString("device.type"), env.local_rank);
  // TF32 for float32 matrix products: libtorch's process-wide switch, read by
  // cuBLAS and cuDNN calls (the host never uses it, so it is refused there).
  const bool tf32 = recipe.getBool("device.tf32");
  PTRAIN_CHECK_AS(ConfigError, !tf32 || device_.is_cuda(), "device.tf32: true, but this run computes on the ",
                  device_.str(), " (device.type: ", recipe.getString("device.type"),
                  "); TF32 is a format of CUDA tensor cores: remove device.tf32 or run on a GPU");
  if (device_.is_cuda()) {
    at::globalContext().setAllowTF32CuBLAS(tf32);
    at::globalContext().setAllowTF32CuDNN(tf32);
  }
  PluginContext ctx;
  ctx.logger = logger();
  ctx.recipe = &recipe;
  ctx.rank = env.rank;
  ctx.world_size = env.world_size;
  ctx.device = device_;
  // NCCL reads its variables when the comm plugin makes its first
  // communicator, so they are in this process's environment before that.
  // Under `ptrain run` they arrived with the worker's environment and the
  // launcher printed them; any other start (torchrun, srun, in-process) sets
  // and prints them here.
  const auto ncclSettings = nccl::applySettings(nccl::settingsFromRecipe(recipe));
  if (env.rank == 0 && env.source != RankSource::kPtrain) {
    for (const auto& setting : ncclSettings) logger()->info("{}", nccl::headerLine(setting));
  }
  CommunicatorOptions commOptions;
  commOptions.backend = recipe.getString("communication.backend");
  if (commOptions.backend == "auto") commOptions.backend = defaultCommBackend(device_);
  if (env.rank == 0 && device_.is_cuda()) {
    logger()->info("device: cuda (each worker on the GPU of its local rank), communication: {}, float32 matrix "
                   "products: {}",
                   commOptions.backend, tf32 ? "tf32 on (device.tf32)" : "full float32 (device.tf32: false)");
  }
  commOptions.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(recipe.getFloat("communication.timeout_s") * 1000.0));
  comm_ = std::make_unique<Communicator>(env, layoutFromRecipe(recipe, env.world_size), *prepared_.registry, ctx,
                                         commOptions);
  if (recipe.has("parallel.groups")) {
    // Each group on its own part of the job (checked by prepareRecipe).
    deviceGroups_ = std::make_shared<const DeviceGroups>(deviceGroupsOf(layoutRequestFromRecipe(recipe, env.world_size)));
    deviceGroup_ = deviceGroups_->indexOf(env.rank);
    const DeviceGroup& mine = (*deviceGroups_)[deviceGroup_];
    groupComm_ = comm_->part(mine.first_rank, mine.sizes.world, ParallelLayout(mine.sizes));
    if (env.rank == 0) logger()->info("device groups: {}", deviceGroups_->describe());
  }
  metrics_ = std::make_unique<Metrics>(isRankZero() ? (fs::path(runDir()) / "metrics.jsonl").string() : "");
  if (isRankZero() && recipe.getBool("log.tensorboard")) {
    const std::string dir = (fs::path(runDir()) / "tensorboard").string();
    try {
      metrics_->tensorboard = std::make_unique<TensorBoardWriter>(dir);
    } catch (const std::exception& e) {
      throw ConfigError(recipe.location("log.tensorboard").str() + ": log.tensorboard: " + e.what() +
                        "; make the run folder writable or set log.tensorboard: false");
    }
    // The recipe once per run (a resumed run's curves continue; its recipe is
    // the one it started with, listed with its changes when resumed).
    if (!resuming()) {
      metrics_->tensorboard->text("recipe", 0, "```yaml\n" + recipe.toYaml() + "```", epochNow());
      metrics_->tensorboard->flush();
    }
  }
  if (recipe.has("checkpoint.on_signal")) {
    for (const auto& name : recipe.getStringList("checkpoint.on_signal")) {
      if (const int sig = stopSignalNumber(name)) stopSignals_.push_back(sig);
    }
  }
  installStopHandlers(stopSignals_);
}

TrainingSession::~TrainingSession() { restoreStopHandlers(); }

int64_t TrainingSession::checkStepFinite(int64_t step, double loss, double gradNorm, bool nonfinite) {
  if (!nonfinite) {
    nonfiniteInARow_ = 0;
    return nonfiniteSkipped_;
  }
  const Recipe& r = recipe();
  const bool skip = r.getString("train.on_nonfinite") == "skip";
  const int64_t limit = r.getInt("train.nonfinite_skip_limit");
  ++nonfiniteInARow_;
  auto shown = [](double v) {
    return std::isnan(v) ? std::string("nan") : std::isinf(v) ? std::string(v > 0 ? "inf" : "-inf") : text::formatNumber(v);
  };
  const std::string what = detail::concat("step ", step, ": loss ", shown(loss), ", gradient norm ", shown(gradNorm));
  if (skip && nonfiniteInARow_ <= limit) {
    ++nonfiniteSkipped_;
    if (isRankZero()) {
      logger()->warn("{}: not finite; update skipped (train.on_nonfinite: skip; {} in a row, {} in all, limit {} in a "
                     "row)",
                     what, nonfiniteInARow_, nonfiniteSkipped_, limit);
    }
    return nonfiniteSkipped_;
  }
  const auto latest = latestCheckpoint(runDir());
  const std::string kept = latest ? detail::concat("the newest checkpoint, step_", *latest, ", is from before it")
                                  : std::string("no checkpoint was saved");
  const std::string why = skip ? detail::concat(" (", nonfiniteInARow_, " steps in a row, over train.nonfinite_skip_limit=",
                                                limit, ")")
                               : "";
  const double lr = r.getFloat("optimizer.lr");
  const std::string resume =
      latest ? detail::concat(", and continue from step_", *latest, ": ptrain run --resume --run-dir ", runDir(),
                              " optimizer.lr=", text::formatNumber(lr / 10), " --allow-changes")
             : "";
  throw NonFiniteError(what + ": not finite, the run diverged" + why + "; nothing of this state was saved, " + kept +
                       ": lower optimizer.lr (now " + text::formatNumber(lr) + ") or add optimizer.warmup_steps" +
                       resume);
}

namespace {
std::string stepKey(int rank) { return "ptrain/step_reached/" + std::to_string(rank); }
}  // namespace

void TrainingSession::recordStepReached(int64_t step) {
  Store* store = comm_->store();
  if (store == nullptr || comm_->worldSize() == 1) return;
  const std::string text = std::to_string(step);
  store->set(stepKey(env_.rank), std::vector<uint8_t>(text.begin(), text.end()));
}

std::string TrainingSession::missingPeers() {
  Store* store = comm_->store();
  if (store == nullptr || comm_->worldSize() == 1) return "";
  try {
    const int world = comm_->worldSize();
    // The ranks that timed out too say so; the one that is stuck or gone
    // cannot. A few seconds let the others' own timeouts come in.
    auto timedOutKey = [](int r) { return "ptrain/timed_out/" + std::to_string(r); };
    store->set(timedOutKey(env_.rank), {1});
    std::vector<int> silent;
    const auto deadline = Clock::now() + std::chrono::seconds(3);
    do {
      silent.clear();
      for (int r = 0; r < world; ++r)
        if (!store->check({timedOutKey(r)})) silent.push_back(r);
      if (silent.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } while (Clock::now() < deadline);
    std::vector<int64_t> reached(static_cast<size_t>(world), -1);
    for (int r = 0; r < world; ++r) {
      if (!store->check({stepKey(r)})) continue;  // never blocks
      const auto bytes = store->get(stepKey(r));
      reached[static_cast<size_t>(r)] = std::stoll(std::string(bytes.begin(), bytes.end()));
    }
    auto describe = [&](int r) {
      const int64_t step = reached[static_cast<size_t>(r)];
      return detail::concat("rank ", r,
                            step < 0 ? " (no step finished)" : " (last finished step " + std::to_string(step) + ")");
    };
    std::string missing;
    for (int r : silent) missing += (missing.empty() ? "" : ", ") + describe(r);
    if (!missing.empty()) return "; the peer that did not arrive: " + missing;
    return "; every rank timed out (a collective no rank could finish; communication.timeout_s too short?)";
  } catch (const std::exception&) {
    return "";  // the store went with its host (rank 0)
  }
}

bool TrainingSession::stopRequested() {
  if (stopSignals_.empty()) return false;
  if (stopAgreed_) return true;
  ProcessGroup& world = comm_->world();
  double received = static_cast<double>(gStopSignal);
  if (world.size() > 1) {
    at::Tensor flag = torch::tensor({received}, torch::kFloat64).to(device_);
    AllreduceOptions max;
    max.op = ReduceOp::kMax;
    world.allreduce(flag, max)->wait();
    received = flag.cpu().item<double>();
  }
  if (received <= 0) return false;
  stopAgreed_ = true;
  stopSignalSeen_ = static_cast<int>(received);
  return true;
}

void TrainingSession::stopAfterSave(int64_t step) {
  throw StoppedBySignal(detail::concat("stopped by ", signalName(stopSignalSeen_), " after step ", step,
                                       ": checkpoint step_", step, " saved; continue with: ptrain run --resume "
                                       "--run-dir ", runDir()));
}

const DeviceGroup* TrainingSession::deviceGroup() const {
  return deviceGroups_ ? &(*deviceGroups_)[deviceGroup_] : nullptr;
}

RuntimeOptions TrainingSession::runtimeOptions() const {
  const Recipe& recipe = prepared_.recipe;
  RuntimeOptions o;
  o.name = "model";
  o.layout = comm_->layout();
  if (deviceGroups_) {
    o.layout = groupComm_->layout();
    o.device_groups = RuntimeOptions::DeviceGroupRun{deviceGroups_, deviceGroup_, comm_->groups().worldGroup()};
  }
  o.device = device_;
  o.seed = static_cast<uint64_t>(recipe.getInt("train.seed"));
  o.precision = recipe.getString("precision.name");
  // Keys of the trainers whose models recompute (keys::addRecompute).
  if (recipe.has("model.recompute")) o.recompute = recipe.getString("model.recompute");
  if (recipe.has("model.recompute_num_layers")) o.recompute_num_layers = recipe.getInt("model.recompute_num_layers");
  o.offload = OffloadSettings::fromRecipe(recipe, runDir());
  if (recipe.has("train.max_memory_mb")) o.max_memory_mb = recipe.getFloat("train.max_memory_mb");
  if (recipe.has("parallel.data_parallel_shares")) {
    o.data_parallel_shares = recipe.getFloatList("parallel.data_parallel_shares");
  }
  o.recipe = &recipe;
  o.optimizer = OptimizerOptions::fromRecipe(recipe);
  return o;
}

std::unique_ptr<ModelRuntime> TrainingSession::makeRuntime(RuntimeOptions options) {
  Trainer& t = trainer();
  // A device group's runtime lives on the group's part of the job.
  Communicator& comm = options.device_groups && groupComm_ ? *groupComm_ : *comm_;
  return std::make_unique<ModelRuntime>(
      comm, registry(), [&t](const ModelBuild& build) { return t.buildModel(build); }, std::move(options));
}

void TrainingSession::writeMetrics(const std::string& kind, nlohmann::json row) {
  metrics_->write(kind, std::move(row));
}

void TrainingSession::beginTraining(int64_t step) {
  figures_.startup_s = secondsSinceLaunch();
  // MFU's denominator. On the cpu: what this rank's threads reach on float32
  // products now (about 50 ms, and only for a trainer that counts its FLOPs),
  // as every rank shares the cores as it will while training.
  peakFlops_ = options_.device_peak_flops;
  if (peakFlops_ <= 0 && device_.is_cpu() && trainer().trainFlops(1) > 0) {
    peakFlops_ = measureHostMatmulFlops(256, 0.05);
  }
  nlohmann::json row{{"step", step}, {"startup_s", figures_.startup_s}};
  if (peakFlops_ > 0) row["peak_flops"] = peakFlops_;
  writeMetrics("startup", std::move(row));
}

void TrainingSession::recordIo(int64_t step, const char* what, double seconds, double bytes) {
  ProcessGroup& world = comm_->world();
  at::Tensor mine = torch::tensor({seconds, bytes}, torch::kFloat64).to(device_);
  at::Tensor all = torch::empty({2 * world.size()}, mine.options());
  if (world.size() > 1) {
    world.allgather(all, mine)->wait();
  } else {
    all.copy_(mine);
  }
  const at::Tensor host = all.cpu().view({world.size(), 2});
  std::vector<double> perRankSeconds, perRankBytes;
  for (int r = 0; r < world.size(); ++r) {
    perRankSeconds.push_back(host[r][0].item<double>());
    perRankBytes.push_back(host[r][1].item<double>());
  }
  const std::string kind = what;
  writeMetrics("checkpoint",
               {{"step", step}, {"checkpoint_" + kind + "_s", perRankSeconds}, {"checkpoint_" + kind + "_bytes", perRankBytes}});
  const double slowest = *std::max_element(perRankSeconds.begin(), perRankSeconds.end());
  double total = 0;
  for (double b : perRankBytes) total += b;
  if (kind == "save") {
    ++figures_.checkpoint_saves;
    figures_.checkpoint_save_s += slowest;
    figures_.checkpoint_save_bytes += total;
  } else {
    figures_.checkpoint_load_s += slowest;
    figures_.checkpoint_load_bytes += total;
  }
}

void TrainingSession::saveCheckpoint(int64_t step, const std::vector<ModelRuntime*>& runtimes,
                                     const nlohmann::json& extra) {
  // Where the trainer's data stands (files, order, samples consumed), for
  // the resume to check it continues the same order.
  nlohmann::json withData = extra.is_object() ? extra : nlohmann::json::object();
  if (!withData.contains("data")) {
    nlohmann::json data = trainer().dataPosition(step, recipe().getInt("train.global_batch_size"));
    if (!data.is_null()) withData["data"] = std::move(data);
  }
  const CheckpointIo io = ptrain::saveCheckpoint(runDir(), step, runtimes, recipe(), withData, comm_->world());
  recordIo(step, "save", io.seconds, static_cast<double>(io.bytes));
}

int64_t TrainingSession::restoreLatest(const std::vector<ModelRuntime*>& runtimes) {
  int64_t step = 0;
  const CheckpointIo io = restoreLatestCheckpoint(runDir(), runtimes, comm_->world(), &step);
  recordIo(step, "load", io.seconds, static_cast<double>(io.bytes));
  // The same on every rank (files and recipe are), so every rank refuses alike.
  const std::string meta = checkpointDir(runDir(), step) + "/meta.json";
  const nlohmann::json saved = readJsonFile(meta).value("data", nlohmann::json());
  if (auto why = trainer().checkDataPosition(saved, step, recipe().getInt("train.global_batch_size"))) {
    throw ConfigError(meta + ": " + *why);
  }
  if (isRankZero() && options_.on_resumed) options_.on_resumed(step);
  return step;
}

int64_t TrainingSession::loadWeightsFrom(const std::string& runDir, const std::vector<std::string>& sources,
                                         const std::vector<ModelRuntime*>& runtimes) {
  Trainer& owner = trainer();
  return loadWeightsFromRun(runDir, sources, runtimes, comm_->world(),
                            [&owner](const std::string& path) { return owner.openForeignWeights(path); });
}

void TrainingSession::addFigures(TrainSummary& summary) {
  ProcessGroup& world = comm_->world();
  at::Tensor mine = torch::tensor({peakRssMb()}, torch::kFloat64).to(device_);
  at::Tensor all = torch::empty({world.size()}, mine.options());
  if (world.size() > 1) {
    world.allgather(all, mine)->wait();
  } else {
    all.copy_(mine);
  }
  const at::Tensor host = all.cpu();
  summary.peak_rss_mb_ranks.assign(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
  nlohmann::json row{{"step", summary.steps}, {"peak_rss_mb_ranks", summary.peak_rss_mb_ranks}};
  if (summary.step_time_s > 0) {
    row["step_time_s"] = summary.step_time_s;
    for (const auto& [phase, seconds] : summary.phase_s) row["time_" + phase + "_s"] = seconds;
  }
  if (summary.mfu >= 0) row["mfu"] = summary.mfu;
  if (deviceGroups_ && summary.steps > 0) {
    // Each group's seconds a step: busy (its own passes, reductions and
    // update) and waiting in the exchange for the others. The slowest group
    // is the busiest; `ptrain doctor` names it.
    at::Tensor times = torch::tensor({summary.step_time_s - summary.cross_group_s, summary.cross_group_s},
                                     torch::kFloat64).to(device_);
    at::Tensor everyone = torch::empty({2 * world.size()}, times.options());
    world.allgather(everyone, times)->wait();
    const at::Tensor perRank = everyone.cpu().view({world.size(), 2});
    nlohmann::json groups = nlohmann::json::array();
    const auto steps = static_cast<double>(summary.steps);
    for (const DeviceGroup& g : deviceGroups_->groups()) {
      double busy = 0, wait = 0;
      for (int r = g.first_rank; r < g.first_rank + g.sizes.world; ++r) {
        busy += perRank[r][0].item<double>();
        wait += perRank[r][1].item<double>();
      }
      groups.push_back({{"name", g.name},
                        {"ranks", g.sizes.world},
                        {"share", g.share},
                        {"busy_s", busy / g.sizes.world / steps},
                        {"wait_s", wait / g.sizes.world / steps}});
    }
    row["device_groups"] = std::move(groups);
  }
  writeMetrics("summary", std::move(row));
  summary.startup_s = figures_.startup_s;
  summary.checkpoint_saves = figures_.checkpoint_saves;
  summary.checkpoint_save_s = figures_.checkpoint_save_s;
  summary.checkpoint_save_bytes = figures_.checkpoint_save_bytes;
  summary.checkpoint_load_s = figures_.checkpoint_load_s;
  summary.checkpoint_load_bytes = figures_.checkpoint_load_bytes;
}

TrainSummary defaultTrainingLoop(TrainingSession& session, Trainer& trainer) {
  return defaultTrainingLoop(session, trainer, session.runtimeOptions());
}

TrainingTask::~TrainingTask() = default;

namespace {

// The default task: one runtime of the trainer's model, batches that are a
// pure function of the step.
class OneModelTask final : public TrainingTask {
 public:
  OneModelTask(TrainingSession& session, Trainer& trainer, const RuntimeOptions& options)
      : trainer_(trainer), runtime_(session.makeRuntime(options)) {
    const Recipe& recipe = session.recipe();
    globalBatch_ = recipe.getInt("train.global_batch_size");
    micro_ = recipe.has("train.micro_batch_size") ? recipe.getInt("train.micro_batch_size") : 0;
    // A device group's own micro-batch size (parallel.groups).
    if (const DeviceGroup* group = session.deviceGroup(); group && group->micro_batch_size) micro_ = *group->micro_batch_size;
  }

  std::vector<ModelRuntime*> checkpointed() override { return {runtime_.get()}; }

  StepReport step(int64_t step) override {
    StepInput input;
    input.step = step;
    std::vector<double> counts;
    {
      PhaseScope data(Phase::kData);
      // Only this rank's rows of the global batch are made.
      const auto [rowsBegin, rowsEnd] = runtime_->dataRows(globalBatch_);
      const Batch rows = trainer_.batchRows(step, globalBatch_, rowsBegin, rowsEnd);
      input.micro_batches = runtime_->cutMicroBatches(rows, micro_);
      // Items the loss is averaged over, counted on the whole global batch
      // (the data-parallel ranks' rows together) so every split of it
      // normalises the same way; its tokens, for throughput.
      counts = runtime_->sumOverDataParallel({trainer_.lossCount(rows), trainer_.tokensIn(rows)});
    }
    input.loss_divisor = counts[0];
    const StepResult result = runtime_->step(input);
    StepReport report;
    report.loss = result.loss;
    report.lr = result.lr;
    report.grad_norm = result.grad_norm;
    report.nonfinite = result.nonfinite;
    report.applied = result.applied;
    report.items = counts[1];
    // Rank 0's: its share of the global batch.
    report.micro_batches = static_cast<int64_t>(input.micro_batches.size());
    for (const auto& [k, v] : result.stats) report.metrics[k] = v;
    report.note = scaleNote(result);
    return report;
  }

  std::map<std::string, double> evaluate() override {
    std::map<std::string, double> result;
    runtime_->inference([&](StagedModel& model, const EvalContext& ctx) { result = trainer_.evaluate(model, ctx); });
    return result;
  }

 private:
  Trainer& trainer_;
  std::unique_ptr<ModelRuntime> runtime_;
  int64_t globalBatch_ = 1;
  int64_t micro_ = 0;
};

}  // namespace

TrainSummary defaultTrainingLoop(TrainingSession& session, Trainer& trainer, const RuntimeOptions& options) {
  OneModelTask task(session, trainer, options);
  return runTrainingLoop(session, task, trainer.throughputUnit());
}

namespace {

// Where the phases of the run's steps went, for the summary.
struct PhaseTotals {
  PhaseSeconds seconds{};
  double steps_s = 0;
  double flops = 0;        // model FLOPs of the steps (Trainer::trainFlops)
  double training_s = 0;   // their seconds without evaluation and checkpoints

  void add(const PhaseSeconds& step) {
    for (size_t p = 0; p < step.size(); ++p) seconds[p] += step[p];
  }
};

double sum(const PhaseSeconds& s) {
  double total = 0;
  for (double v : s) total += v;
  return total;
}

}  // namespace

TrainSummary runTrainingLoop(TrainingSession& session, TrainingTask& task, const std::string& unit) {
  const Recipe& recipe = session.recipe();
  const auto wallStart = Clock::now();
  const bool isRankZero = session.isRankZero();
  Trainer& trainer = session.trainer();

  const int64_t steps = recipe.getInt("train.steps");
  const int64_t evalEvery = recipe.getInt("train.eval_every");
  const int64_t logEvery = recipe.getInt("train.log_every");
  const int64_t ckptEvery = recipe.getInt("checkpoint.every");

  int64_t step = 0;
  if (session.resuming()) {
    step = session.restoreLatest(task.checkpointed());
    if (isRankZero) logger()->info("resumed from step {} in {}", step, session.runDir());
  } else if (recipe.has("checkpoint.load")) {
    // Another run's weights (a GRPO run's actor too); optimizer and data fresh.
    const std::string from = recipe.getString("checkpoint.load");
    const int64_t loaded = session.loadWeightsFrom(from, {"model", "actor"}, task.loadTargets());
    if (isRankZero) {
      logger()->info("weights from {}{}; optimizer and data start fresh", from,
                     loaded >= 0 ? " (step " + std::to_string(loaded) + ")" : std::string());
    }
  }
  Progress progress(isRankZero, recipe.getString("log.progress"), steps, step, unit);

  TrainSummary summary;
  summary.throughput_unit = unit;
  auto evaluate = [&](int64_t atStep) {
    PhaseScope evaluation(Phase::kEval);
    summary.eval = task.evaluate();
    nlohmann::json evalLine{{"step", atStep}};
    for (const auto& [k, v] : summary.eval) evalLine[k] = v;
    session.writeMetrics("eval", evalLine);
    progress.note(formatEval(atStep, summary.eval));
  };
  if (step == 0 && task.evaluatesAtStart()) evaluate(0);
  session.beginTraining(step);

  std::optional<OpCounter> opCounter;
  if (recipe.getBool("log.count_ops")) opCounter.emplace();
  std::optional<StepProfiler> profiler;
  if (recipe.has("log.profile_steps")) {
    const auto window = recipe.getIntList("log.profile_steps");
    if (window.size() == 2) {
      const std::string path =
          (fs::path(session.runDir()) / "traces" / ("rank" + std::to_string(session.env().rank) + ".json")).string();
      profiler.emplace(window[0], window[1], path, session.device().is_cuda());
    }
  }
  const double peakFlops = session.devicePeakFlops();
  const bool countsFlops = trainer.trainFlops(1) > 0 && peakFlops > 0;
  const int world = session.env().world_size;
  const at::Device device = session.device();
  const std::string rateKey = unit + "_per_s";

  double itemsTotal = 0, timeTotal = 0, crossGroupSeconds = 0;
  PhaseTotals totals;
  while (step < steps) {
    if (profiler) profiler->beforeStep(step + 1);
    // The whole iteration: the step, its evaluation and checkpoint, its row
    // and line; what no inner phase claims is "other".
    const auto stepStart = Clock::now();
    takePhaseSeconds();  // from here
    std::optional<PhaseScope> iteration(std::in_place, Phase::kOther);
    if (opCounter) opCounter->reset();
    StepReport report = task.step(step);
    const int64_t ops = opCounter ? opCounter->count() : 0;
    ++step;
    summary.final_loss = report.loss;
    // The step's memory, before its evaluation and checkpoint (their peaks
    // show in the next step's): what train.max_memory_mb is checked against.
    // The kernel's peak (ru_maxrss) is counted apart from the resident pages
    // now (statm) and can trail them by a few pages.
    const double memMb = device.is_cuda() ? deviceMemoryMb(device) : currentRssMb();
    const double peakMemMb = std::max(memMb, device.is_cuda() ? peakDeviceMemoryMb(device) : peakRssMb());
    const double hostPeakMb = device.is_cuda() ? peakRssMb() : peakMemMb;

    nlohmann::json line{{"step", step},
                        {"loss", report.loss},
                        {"lr", report.lr},
                        {"grad_norm", report.grad_norm},
                        {"micro_batches", report.micro_batches}};
    if (!report.applied) line["skipped"] = true;
    if (report.nonfinite) line["nonfinite"] = true;
    if (opCounter) line["aten_ops"] = ops;
    for (const auto& [k, v] : report.metrics.items()) line[k] = v;
    try {
      session.checkStepFinite(step, report.loss, report.grad_norm, report.nonfinite);
    } catch (...) {
      session.writeMetrics("train", line);  // the step that ended the run, as far as it got
      throw;
    }
    session.recordStepReached(step);

    if ((evalEvery > 0 && step % evalEvery == 0) || step == steps) evaluate(step);
    bool saved = false;
    if ((ckptEvery > 0 && step % ckptEvery == 0) ||
        (step == steps && recipe.getBool("checkpoint.save_final"))) {
      PhaseScope saving(Phase::kCheckpoint);
      session.saveCheckpoint(step, task.checkpointed());
      saved = true;
    }
    const bool stop = session.stopRequested();
    if (stop && !saved) {
      PhaseScope saving(Phase::kCheckpoint);
      session.saveCheckpoint(step, task.checkpointed());
    }
    // The row: the step's figures and where its time went. Writing it and
    // the progress line are the last of "other", a few microseconds.
    iteration.reset();
    const PhaseSeconds phases = takePhaseSeconds();
    const double stepTime = seconds(stepStart);
    const double trainingTime = std::max(1e-9, sum(phases) - phases[static_cast<size_t>(Phase::kEval)] -
                                                   phases[static_cast<size_t>(Phase::kCheckpoint)]);
    const double rate = report.items / trainingTime;
    itemsTotal += report.items;
    timeTotal += trainingTime;
    totals.add(phases);
    totals.steps_s += stepTime;
    if (report.metrics.contains("cross_group_s")) crossGroupSeconds += report.metrics["cross_group_s"].get<double>();
    totals.training_s += trainingTime;
    double mfu = -1;
    if (countsFlops) {
      const double flops = trainer.trainFlops(report.items);
      totals.flops += flops;
      mfu = flops / trainingTime / (peakFlops * world);
      line["mfu"] = mfu;
    }
    line[rateKey] = rate;
    line["step_time_s"] = stepTime;
    for (size_t p = 0; p < phases.size(); ++p) {
      line[std::string("time_") + phaseName(static_cast<Phase>(p)) + "_s"] = phases[p];
    }
    if (device.is_cuda()) {
      line["device_mem_mb"] = memMb;
      line["peak_device_mb"] = peakMemMb;
    } else {
      line["mem_mb"] = memMb;
    }
    line["peak_rss_mb"] = hostPeakMb;
    session.writeMetrics("train", line);
    ProgressLine shown;
    shown.step = step;
    shown.loss = report.loss;
    shown.lr = report.lr;
    shown.grad_norm = report.grad_norm;
    shown.mfu = mfu;
    shown.rate = rate;
    shown.mem_mb = memMb;
    shown.peak_mem_mb = peakMemMb;
    shown.extra = report.note;
    progress.update(shown, step % logEvery == 0 || step == steps);
    // After the step's time is taken: writing the trace is not the step's.
    if (profiler) profiler->afterStep(step);

    if (stop) {
      progress.finish();
      session.stopAfterSave(step);
    }
  }
  progress.finish();
  summary.steps = step;
  summary.tokens_per_s = timeTotal > 0 ? itemsTotal / timeTotal : 0;
  summary.step_time_s = totals.steps_s;
  summary.cross_group_s = crossGroupSeconds;
  for (size_t p = 0; p < totals.seconds.size(); ++p) summary.phase_s[phaseName(static_cast<Phase>(p))] = totals.seconds[p];
  if (countsFlops && totals.training_s > 0) summary.mfu = totals.flops / totals.training_s / (peakFlops * world);
  summary.wall_s = seconds(wallStart);
  return summary;
}

TrainSummary train(PreparedRecipe& prepared, const RankEnv& env, const EngineOptions& options) {
  const auto wallStart = Clock::now();
  TrainingSession session(prepared, env, options);
  for (const auto& w : prepared.warnings)
    if (session.isRankZero()) logger()->warn("{}", w);
  TrainSummary summary;
  try {
    summary = prepared.trainer->train(session);
  } catch (const TimeoutError& e) {
    // Which rank was missing: the store knows where each one got to.
    throw TimeoutError(e.what() + session.missingPeers());
  }
  session.addFigures(summary);
  summary.wall_s = seconds(wallStart);
  session.comm().world().barrier()->wait();
  return summary;
}

}  // namespace ptrain

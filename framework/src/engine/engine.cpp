#include "ptrain/engine/engine.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "engine/checkpointer.h"
#include "engine/progress.h"
#include "ptrain/comm/communicator.h"
#include "ptrain/core/logging.h"
#include "ptrain/core/resources.h"
#include "ptrain/engine/optimizer.h"
#include "ptrain/engine/parallel.h"
#include "ptrain/engine/recipe_layout.h"
#include "ptrain/engine/trainer.h"
#include "ptrain/plugin/registry.h"

namespace fs = std::filesystem;

namespace ptrain {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// The parallel plugins a layout needs, in the order they are applied.
std::vector<std::string> parallelPluginsFor(const ParallelLayout& layout) {
  std::vector<std::string> names;
  if (layout.tp() > 1) names.push_back("tensor");
  if (layout.ep() > 1) names.push_back("expert");
  if (layout.pp() > 1) names.push_back("pipeline");
  names.push_back("data");
  return names;
}

}  // namespace

TrainSummary train(PreparedRecipe& prepared, const RankEnv& env, const EngineOptions& options) {
  const Recipe& recipe = prepared.recipe;
  Trainer& trainer = *prepared.trainer;
  const auto wallStart = Clock::now();

  PluginContext ctx;
  ctx.logger = logger();
  ctx.recipe = &recipe;
  ctx.rank = env.rank;
  ctx.world_size = env.world_size;

  CommunicatorOptions commOptions;
  commOptions.backend = recipe.getString("communication.backend");
  commOptions.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(recipe.getFloat("communication.timeout_s") * 1000.0));
  Communicator comm(env, layoutFromRecipe(recipe, env.world_size), *prepared.registry, ctx,
                    commOptions);
  const ParallelLayout& layout = comm.layout();
  auto dpGroup = comm.group(GroupKind::kData);
  const int dpRank = dpGroup->rank();
  const int dp = dpGroup->size();
  const bool isRankZero = env.rank == 0;
  for (const auto& w : prepared.warnings)
    if (isRankZero) logger()->warn("{}", w);

  // Same seed, same weights on every rank and in every layout.
  const int64_t seed = recipe.getInt("train.seed");
  torch::manual_seed(static_cast<uint64_t>(seed));
  auto model = trainer.buildModel();
  model->module().train();

  std::vector<std::unique_ptr<Plugin>> pluginObjects;
  std::vector<ParallelPlugin*> parallel;
  for (const auto& name : parallelPluginsFor(layout)) {
    pluginObjects.push_back(prepared.registry->create(plugin_kind::kParallel, name, ctx, "parallel"));
    parallel.push_back(static_cast<ParallelPlugin*>(pluginObjects.back().get()));
    parallel.back()->apply(*model, comm);
  }

  Optimizer optimizer(model->localParameters(), OptimizerOptions::fromRecipe(recipe));
  auto tpGroup = comm.group(GroupKind::kTensor);
  auto ppGroup = comm.group(GroupKind::kPipeline);
  // The writer's pipeline (tensor rank 0, data rank 0) brings every stage's
  // tensors to rank 0.
  const bool inWriterPipeline = tpGroup->rank() == 0 && dpRank == 0;
  Checkpointer checkpointer(options.run_dir, recipe, layout.describe(), tpGroup, ppGroup, inWriterPipeline);

  // Gradient norm: shards are summed over the model-parallel group (tensor x
  // pipeline); a parameter replicated on every tensor-parallel rank is counted
  // by its first rank only, and a pipeline copy (a tied embedding on the last
  // stage) by its owner only.
  std::vector<bool> countedInNorm;
  for (const auto& name : optimizer.parameterNames()) {
    countedInNorm.push_back((model->shard_specs.count(name) > 0 || tpGroup->rank() == 0) &&
                            model->mirrored_parameters.count(name) == 0);
  }
  auto modelGroup = comm.group(GroupKind::kModel);
  std::function<void(at::Tensor&)> sumNormSquares;
  if (modelGroup->size() > 1) sumNormSquares = [&](at::Tensor& t) { modelGroup->allreduce(t)->wait(); };

  const int64_t steps = recipe.getInt("train.steps");
  const int64_t globalBatch = recipe.getInt("train.global_batch_size");
  const int64_t localBatch = globalBatch / dp;
  const int64_t micro = recipe.has("train.micro_batch_size") ? recipe.getInt("train.micro_batch_size") : localBatch;
  const int numMicro = static_cast<int>(localBatch / micro);
  const int64_t evalEvery = recipe.getInt("train.eval_every");
  const int64_t logEvery = recipe.getInt("train.log_every");
  const int64_t ckptEvery = recipe.getInt("checkpoint.every");

  int64_t step = 0;
  if (options.resume) {
    step = checkpointer.restoreLatest(*model, optimizer);
    if (isRankZero) logger()->info("resumed from step {} in {}", step, options.run_dir);
  }

  MetricsWriter metrics(isRankZero ? (fs::path(options.run_dir) / "metrics.jsonl").string() : "");
  Progress progress(isRankZero, recipe.getString("log.progress"), steps, step);

  auto evaluate = [&]() {
    EvalContext ectx;
    ectx.shard = dpRank;
    ectx.num_shards = dp;
    ectx.all_reduce_sum = [&](at::Tensor& t) { dpGroup->allreduce(t)->wait(); };
    model->module().eval();
    auto result = trainer.evaluate(*model, ectx);
    model->module().train();
    return result;
  };

  TrainSummary summary;
  double tokensTotal = 0, timeTotal = 0;
  while (step < steps) {
    const auto stepStart = Clock::now();
    Batch batch = trainer.globalBatch(step, globalBatch);
    // Items the loss is averaged over, counted on the whole global batch so
    // every split of it normalises the same way.
    const double globalCount = trainer.lossCount(batch);
    Batch local = batch.slice(dpRank * localBatch, (dpRank + 1) * localBatch);

    std::vector<Batch> micros;
    for (int m = 0; m < numMicro; ++m) micros.push_back(local.slice(m * micro, (m + 1) * micro));
    // Under pipeline parallelism every stage draws its own dropout masks, from
    // a stream fixed by the seed, the step and the stage (so a resumed run
    // draws the same ones).
    if (ppGroup->size() > 1) {
      torch::manual_seed(static_cast<uint64_t>(seed) * 1000003ULL + static_cast<uint64_t>(step) * 1009ULL +
                         static_cast<uint64_t>(ppGroup->rank()));
    }
    for (auto* p : parallel) p->beginStep();
    MicroBatchRun run;
    run.model = model.get();
    run.micro_batches = &micros;
    run.loss_scale = 1.0 / globalCount;
    run.before_backward = [&](int index, int count) {
      for (auto* p : parallel) p->beforeBackward(index, count);
    };
    double lossSum = 0;
    bool scheduled = false;
    for (auto* p : parallel) {
      if (auto sum = p->runMicroBatches(run)) {
        lossSum = *sum;
        scheduled = true;
        break;
      }
    }
    if (!scheduled) {
      for (int m = 0; m < numMicro; ++m) {
        run.before_backward(m, numMicro);
        LossOutput out = model->forward(micros[static_cast<size_t>(m)]);
        (out.loss_sum * run.loss_scale).backward();
        lossSum += out.loss_sum.item<double>();
      }
    }
    // Unwound in reverse order of application: data-parallel sums first, then
    // e.g. tensor-parallel sums of partial (sequence-parallel) gradients.
    for (auto it = parallel.rbegin(); it != parallel.rend(); ++it) (*it)->finishGradients();

    const double lr = learningRate(optimizer.options(), step);
    const double gradNorm = globalGradNorm(optimizer.parameters(), sumNormSquares, countedInNorm);
    // Clipping is folded into the update: the optimizer scales each gradient as it reads it.
    optimizer.step(lr, clipCoefficient(gradNorm, optimizer.options().clip_grad));
    optimizer.zeroGrad();
    ++step;

    at::Tensor lossT = torch::tensor({lossSum}, torch::kFloat64);
    if (dp > 1) dpGroup->allreduce(lossT)->wait();
    // Only the last pipeline stage computes the loss; the others add 0.
    if (ppGroup->size() > 1) ppGroup->allreduce(lossT)->wait();
    const double loss = lossT.item<double>() / globalCount;
    const double stepTime = seconds(stepStart);
    const double tokens = trainer.tokensIn(batch);
    tokensTotal += tokens;
    timeTotal += stepTime;
    summary.final_loss = loss;

    nlohmann::json line{{"step", step},
                        {"loss", loss},
                        {"lr", lr},
                        {"grad_norm", gradNorm},
                        {"tokens_per_s", tokens / stepTime},
                        {"step_time_s", stepTime},
                        {"peak_rss_mb", peakRssMb()}};
    for (auto* p : parallel)
      for (const auto& [k, v] : p->stepStats()) line[k] = v;
    metrics.write(line);
    progress.update(step, loss, tokens / stepTime, step % logEvery == 0 || step == steps);

    if ((evalEvery > 0 && step % evalEvery == 0) || step == steps) {
      summary.eval = evaluate();
      nlohmann::json evalLine{{"step", step}};
      for (const auto& [k, v] : summary.eval) evalLine[k] = v;
      metrics.write(evalLine);
      progress.note(formatEval(step, summary.eval));
    }
    if ((ckptEvery > 0 && step % ckptEvery == 0) ||
        (step == steps && recipe.getBool("checkpoint.save_final"))) {
      checkpointer.save(step, *model, optimizer, isRankZero, comm.world());
    }
  }
  progress.finish();
  summary.steps = step;
  summary.tokens_per_s = timeTotal > 0 ? tokensTotal / timeTotal : 0;
  summary.wall_s = seconds(wallStart);
  comm.world().barrier()->wait();
  return summary;
}

}  // namespace ptrain

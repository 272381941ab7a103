// Helpers for tests that drive the llm trainer's GPT through ModelRuntime on
// one rank or on forked ranks (test_runtime.cpp, test_precision.cpp).
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ptrain/comm/communicator.h"
#include "ptrain/comm/rank_env.h"
#include "ptrain/core/logging.h"
#include "ptrain/engine/recipe_schema.h"
#include "ptrain/engine/runtime.h"
#include "ptrain/plugin/registry.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"
#include "support/test_support.h"
#include "../../trainers/llm/llm_trainer.h"

namespace ptrain::llm_fixture {

// The plugins of this build.
inline PluginRegistry& registry() {
  static PluginRegistry r(PluginRegistry::defaultSearchPath({}));
  return r;
}

// Checked as `ptrain run` checks it: the core's keys, the trainer's and those
// of the plugins the recipe uses (fp16's loss scale, offload/tiered's tier).
inline Recipe llmRecipe(llm::LlmTrainer& trainer, const std::vector<std::string>& overrides) {
  Recipe recipe = Recipe::fromString(
      "trainer: {name: llm}\n"
      "model: {num_layers: 4, hidden_size: 32, num_attention_heads: 4, seq_length: 8}\n"
      "data: {digits: 1, eval_size: 8}\n"
      "train: {steps: 3, global_batch_size: 8, seed: 5}\n"
      "optimizer: {lr: 0.003}\n",
      "<test>", overrides);
  Schema schema;
  describeCoreKeys(schema);
  Recipe probe = recipe;
  probe.validateAll(schema, /*allowUnknown=*/true);
  addPluginKeys(schema, probe, registry(), &trainer);
  recipe.validate(schema);
  return recipe;
}

inline RuntimeOptions llmOptions(const Recipe& recipe, const ParallelLayout& layout, bool trained) {
  RuntimeOptions o;
  o.layout = layout;
  o.seed = 5;
  o.recipe = &recipe;
  o.precision = recipe.getString("precision.name");
  o.recompute = recipe.getString("model.recompute");
  o.recompute_num_layers = recipe.getInt("model.recompute_num_layers");
  // The disk tier's file is unlinked once mapped: a shared folder is enough.
  o.offload = OffloadSettings::fromRecipe(recipe, (std::filesystem::temp_directory_path() / "ptrain-test-offload").string());
  if (trained) o.optimizer = OptimizerOptions::fromRecipe(recipe);
  return o;
}

inline ParallelLayout layoutOf(int world, int tp, int pp, int ep = 1, int etp = 1) {
  LayoutSizes s;
  s.world = world;
  s.tp = tp;
  s.pp = pp;
  s.ep = ep;
  s.etp = etp;
  return ParallelLayout(s);
}

// One training step of the llm trainer's global batch of 8 rows, as the
// default loop takes it.
inline StepResult llmStep(ModelRuntime& rt, llm::LlmTrainer& trainer, int step, int64_t microBatchSize) {
  Batch batch = trainer.globalBatch(step, 8);
  StepInput in;
  in.step = step;
  in.micro_batches = rt.microBatches(batch, microBatchSize);
  in.loss_divisor = trainer.lossCount(batch);
  return rt.step(in);
}

// The losses of three steps of the whole model on one rank.
inline std::vector<double> singleRankLosses(llm::LlmTrainer& trainer, const Recipe& recipe) {
  auto comm = Communicator::loopback();
  ModelRuntime rt(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                  llmOptions(recipe, comm->layout(), true));
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) losses.push_back(llmStep(rt, trainer, step, 4).loss);
  return losses;
}

inline std::unique_ptr<Communicator> worldOf(int rank, int size, int port, const ParallelLayout& layout) {
  at::set_num_threads(1);
  RankEnv env;
  env.rank = rank;
  env.world_size = size;
  env.local_rank = rank;
  env.local_world_size = size;
  env.master_port = port;
  PluginContext ctx;
  ctx.logger = logger();
  ctx.rank = rank;
  ctx.world_size = size;
  CommunicatorOptions options;
  options.timeout = std::chrono::seconds(60);
  return std::make_unique<Communicator>(env, layout, registry(), ctx, options);
}

// The overrides that put the llm recipe on a tp x pp layout.
inline std::vector<std::string> layoutOverrides(int tp, int pp, bool sequenceParallel) {
  return {"parallel.tensor_model_parallel_size=" + std::to_string(tp),
          "parallel.pipeline_model_parallel_size=" + std::to_string(pp),
          std::string("parallel.sequence_parallel=") + (sequenceParallel ? "true" : "false")};
}

// On a forked rank: three steps of `recipe`'s model on this rank's part of a
// world x tp x pp layout (two micro-batches per data-parallel rank, as
// singleRankLosses takes), each loss within tolerance(step) of reference[step].
inline void expectLayoutMatches(int rank, int size, int port, llm::LlmTrainer& trainer, const Recipe& recipe, int tp,
                                int pp, const std::vector<double>& reference,
                                const std::function<double(int step)>& tolerance) {
  auto comm = worldOf(rank, size, port, layoutOf(size, tp, pp));
  ModelRuntime rt(*comm, registry(), [&](const ModelBuild& b) { return trainer.buildModel(b); },
                  llmOptions(recipe, comm->layout(), true));
  for (int step = 0; step < 3; ++step) {
    StepResult r = llmStep(rt, trainer, step, 8 / (size / (tp * pp)) / 2);
    EXPECT_TRUE(r.applied);
    EXPECT_LT(test::relDiff(r.loss, reference[static_cast<size_t>(step)]), tolerance(step)) << "step " << step;
  }
}

}  // namespace ptrain::llm_fixture

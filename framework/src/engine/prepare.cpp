#include <cstdlib>
#include <set>
#include <sstream>
#include <utility>

#include "ptrain/comm/nccl_settings.h"
#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/engine/engine.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/parallel_plugins.h"
#include "ptrain/engine/precision.h"
#include "ptrain/engine/memory_settings.h"
#include "ptrain/engine/moe_settings.h"
#include "ptrain/engine/offload.h"
#include "ptrain/engine/recipe_layout.h"
#include "ptrain/engine/recipe_schema.h"
#include "ptrain/engine/trainer.h"
#include "ptrain/engine/weights_source.h"
#include "engine/checkpointer.h"
#include "ptrain/nn/deferred_init.h"
#include "ptrain/plugin/registry.h"
#include "ptrain/recipe/schema.h"

namespace ptrain {

void checkModelBuildsSlices(const Recipe& recipe, const LayoutRequest& layout, Trainer& trainer) {
  if (layout.tp <= 1 && layout.ep <= 1 && layout.etp <= 1) return;
  std::shared_ptr<StagedModel> model;
  {
    nn::DeferredInit deferred;
    model = trainer.buildModel(ModelBuild{});
  }
  if (!model) return;
  const bool experts = model->numExperts() > 0;
  if (!experts && layout.tp <= 1) return;
  if (auto problem = checkShardedBuild(*model, layout.tp, experts ? layout.ep : 1, experts ? layout.etp : 1)) {
    const std::string key =
        layout.tp > 1 ? "parallel.tensor_model_parallel_size" : "parallel.expert_model_parallel_size";
    // A model's own message may already name the key.
    const std::string text = problem->rfind(key + ": ", 0) == 0 ? problem->substr(key.size() + 2) : *problem;
    recipe.fail(key, text);
  }
}

namespace {

// communication.backend names a comm plugin that is installed ("auto" picks
// one by device when the run starts).
std::vector<std::string> checkCommBackend(const Recipe& recipe, PluginRegistry& registry) {
  const std::string backend = recipe.getString("communication.backend");
  if (backend == "auto") return {};
  std::string installed;
  for (const auto& p : registry.plugins()) {
    if (p.kind != plugin_kind::kComm) continue;
    if (p.name == backend) return {};
    installed += (installed.empty() ? "" : ", ") + p.name;
  }
  return {recipe.location("communication.backend").str() + ": communication.backend: no comm plugin named '" +
          backend + "' is installed; expected auto" + (installed.empty() ? "" : " or one of: " + installed) +
          " (`ptrain plugins` lists them)"};
}

// checkpoint.load names weights this trainer's model can start from: a run
// or step folder, a safetensors file, or a folder of another framework the
// trainer reads (whose config it compares with the model). After setup.
void checkWeightsSource(const Recipe& recipe, const Trainer& trainer) {
  if (!recipe.has("checkpoint.load")) return;
  try {
    std::unique_ptr<CheckpointReader> reader;
    int64_t step = 0;
    openWeights(recipe.getString("checkpoint.load"), {"model", "actor"},
                [&trainer](const std::string& path) { return trainer.openForeignWeights(path); }, &reader, &step);
  } catch (const CheckpointError& e) {
    recipe.fail("checkpoint.load", e.what());
  }
}

// One ConfigError with a line per problem; nothing when there is none.
void throwProblems(const std::vector<std::string>& problems) {
  if (problems.empty()) return;
  std::ostringstream os;
  for (size_t i = 0; i < problems.size(); ++i) os << (i ? "\n" : "") << problems[i];
  throw ConfigError(os.str());
}

}  // namespace

PreparedRecipe::PreparedRecipe() = default;
PreparedRecipe::~PreparedRecipe() = default;
PreparedRecipe::PreparedRecipe(PreparedRecipe&&) noexcept = default;

PreparedRecipe prepareRecipe(const std::string& path, const std::vector<std::string>& overrides, int worldSize,
                             int rank) {
  PreparedRecipe out;
  out.recipe = Recipe::load(path, overrides);
  // `parallel: auto` is resolved by `ptrain run` (and `ptrain check`) before
  // any worker starts; a worker started by another launcher has no one to
  // agree with on what the search picks.
  if (writesAutoLayout(out.recipe)) {
    out.recipe.fail("parallel", "auto is chosen by `ptrain run` before it starts the workers; a worker started by "
                                "another launcher (torchrun, srun) needs the layout written out: `ptrain check "
                                "RECIPE --nproc N` prints what auto picks");
  }

  // The core keys first: they say where plugins are and which trainer to load.
  Schema schema;
  describeCoreKeys(schema);
  Recipe probe = out.recipe;
  probe.validate(schema, /*allowUnknown=*/true);

  out.registry = std::make_unique<PluginRegistry>(
      PluginRegistry::defaultSearchPath(probe.getStringList("plugins.paths")));
  PluginContext ctx;
  ctx.recipe = &out.recipe;
  ctx.rank = rank;
  // A trainer with several layouts in one run (the GRPO rollout's) checks
  // them against the world in setup().
  ctx.world_size = worldSize > 0 ? worldSize : static_cast<int>(probe.getInt("launch.nproc"));
  const std::string trainerName = probe.getString("trainer.name");
  try {
    auto plugin = out.registry->create(plugin_kind::kTrainer, trainerName, ctx, "trainer.name");
    out.trainer.reset(static_cast<Trainer*>(plugin.release()));
  } catch (const PluginLoadError& e) {
    // The registry's message already names the key it was asked for.
    std::string why = e.what();
    if (why.rfind("trainer.name: ", 0) == 0) why = why.substr(std::string("trainer.name: ").size());
    probe.fail("trainer.name", why);
  }
  // Its keys, and those of every plugin the recipe uses.
  addPluginKeys(schema, probe, *out.registry, out.trainer.get());
  out.recipe.validate(schema);

  out.world_size = worldSize > 0 ? worldSize : static_cast<int>(out.recipe.getInt("launch.nproc"));
  LayoutRequest layout = layoutRequestFromRecipe(out.recipe, out.world_size);
  // communication.nccl is a free-form map to the schema: NCCL's table checks it.
  auto problems = nccl::checkRecipe(out.recipe);
  for (auto& p : checkPrecision(out.recipe, *out.registry)) problems.push_back(std::move(p));
  for (auto& p : checkMoeSettings(out.recipe)) problems.push_back(std::move(p));
  for (auto& p : checkMemorySettings(out.recipe)) problems.push_back(std::move(p));
  for (auto& p : checkOffload(out.recipe)) problems.push_back(std::move(p));
  for (auto& p : checkCommBackend(out.recipe, *out.registry)) problems.push_back(std::move(p));
  for (auto& p : checkStopSignals(out.recipe)) problems.push_back(std::move(p));
  for (auto& p : checkProfileSteps(out.recipe)) problems.push_back(std::move(p));
  if (out.recipe.getBool("device.tf32") && out.recipe.getString("device.type") == "cpu") {
    // The run refuses it too where `auto` finds no GPU (TrainingSession).
    problems.push_back(out.recipe.location("device.tf32").str() +
                       ": device.tf32: true, but device.type is cpu; TF32 is a format of CUDA tensor cores: remove "
                       "device.tf32 or set device: cuda");
  }
  {
    // The sizes alone before the trainer sets up (its setup may rely on a
    // layout that splits the world); the model's shape after.
    LayoutRequest sizesOnly = layout;
    sizesOnly.num_layers = sizesOnly.hidden_size = sizesOnly.num_attention_heads = sizesOnly.ffn_hidden_size =
        sizesOnly.seq_length = sizesOnly.moe_router_topk = std::nullopt;
    sizesOnly.num_experts = layout.num_experts;
    for (auto& p : checkLayout(sizesOnly)) problems.push_back(std::move(p));
  }
  throwProblems(problems);
  out.trainer->setup(out.recipe);
  // The layout checks read the model's shape as the trainer built it.
  if (const auto shape = out.trainer->modelShape()) applyModelShape(layout, *shape);
  problems = checkLayout(layout);
  // A size no installed plugin executes would only repeat the same work.
  for (auto& p : checkParallelPlugins(layout, *out.registry)) problems.push_back(std::move(p));
  throwProblems(problems);
  out.warnings = layoutWarnings(layout);
  const LayoutPlan sized = planLayout(layout);
  for (auto& w : memorySettingWarnings(out.recipe, sized.dp, sized.edp)) out.warnings.push_back(std::move(w));
  if (layout.groups.empty()) {
    checkModelBuildsSlices(out.recipe, layout, *out.trainer);
  } else {
    for (size_t i = 0; i < layout.groups.size(); ++i) checkModelBuildsSlices(out.recipe, groupRequest(layout, i), *out.trainer);
  }
  checkWeightsSource(out.recipe, *out.trainer);
  return out;
}

namespace {

// "1e-3" and "0.001" are one value.
bool sameValue(const std::string& a, const std::string& b) {
  if (a == b) return true;
  char* endA = nullptr;
  char* endB = nullptr;
  const double x = std::strtod(a.c_str(), &endA);
  const double y = std::strtod(b.c_str(), &endB);
  return !a.empty() && !b.empty() && *endA == '\0' && *endB == '\0' && x == y;
}

}  // namespace

std::vector<std::string> recipeChanges(const std::string& beforePath, const PreparedRecipe& after) {
  Schema schema;
  describeCoreKeys(schema);
  {
    Recipe probe = after.recipe;
    addPluginKeys(schema, probe, *after.registry, after.trainer.get());
  }
  Recipe before = Recipe::load(beforePath);
  // Its defaults filled as the new recipe's were; a problem it has under
  // today's schema is the new recipe's business, not a change.
  before.validateAll(schema, /*allowUnknown=*/true);
  std::set<std::string> keys;
  for (const auto& k : before.keysUnder("")) keys.insert(k);
  for (const auto& k : after.recipe.keysUnder("")) keys.insert(k);
  std::vector<std::string> changes;
  for (const auto& key : keys) {
    const std::string was = before.valueText(key);
    const std::string now = after.recipe.valueText(key);
    if (sameValue(was, now)) continue;
    changes.push_back(key + ": " + (was.empty() ? "(not set)" : was) + " -> " + (now.empty() ? "(not set)" : now));
  }
  return changes;
}

}  // namespace ptrain

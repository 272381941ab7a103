// ptrain check: load a recipe, validate it against the schema and its parallel
// layout against a world size (and the installed parallel plugins), without
// starting any worker.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <optional>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "ptrain/comm/nccl_settings.h"
#include "ptrain/core/logging.h"
#include "ptrain/engine/engine.h"
#include "ptrain/engine/parallel_plugins.h"
#include "ptrain/engine/recipe_layout.h"
#include "ptrain/engine/precision.h"
#include "ptrain/engine/memory_settings.h"
#include "ptrain/engine/moe_settings.h"
#include "ptrain/engine/offload.h"
#include "ptrain/engine/recipe_schema.h"
#include "ptrain/engine/trainer.h"
#include "ptrain/layout/device_groups.h"
#include "ptrain/pipeline/schedule.h"
#include "ptrain/plugin/registry.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"

namespace ptrain::cli {

// Adds the keys that the trainer named by `trainer.name` declares for its
// model.* and data.* sections. Returns false, adding nothing and saying why in
// `whyNot`, when there is no such trainer to ask (no trainer.name, none of that
// name on the plugin search path, or a library that cannot be loaded); `check`
// then holds the recipe to the core keys alone, so the trainer's own keys are
// reported as unknown.
bool extendSchemaFromTrainer(const Recipe& recipe, Schema& schema, std::string* whyNot,
                             std::unique_ptr<Plugin>* trainerOut, int worldSize);

// The world size the recipe asks for (launch.nproc), for the callers that
// have no --nproc of their own.
bool extendSchemaFromTrainer(const Recipe& recipe, Schema& schema, std::string* whyNot,
                             std::unique_ptr<Plugin>* trainerOut) {
  int world = 1;
  try {
    if (recipe.has("launch.nproc")) world = static_cast<int>(recipe.getInt("launch.nproc"));
  } catch (const ConfigError&) {
    // Malformed: validation reports it.
  }
  return extendSchemaFromTrainer(recipe, schema, whyNot, trainerOut, world);
}

// `worldSize`: the trainer's PluginContext::world_size (a trainer with several
// layouts checks them against it in setup()).
bool extendSchemaFromTrainer(const Recipe& recipe, Schema& schema, std::string* whyNot,
                             std::unique_ptr<Plugin>* trainerOut, int worldSize) {
  // The recipe is not validated yet: a malformed plugins.paths or trainer.name
  // is reported by validation, so here it only means "no trainer to ask".
  std::string name;
  std::vector<std::string> paths;
  try {
    if (!recipe.has("trainer.name")) {
      *whyNot = "trainer.name is not set";
      return false;
    }
    name = recipe.getString("trainer.name");
    if (recipe.has("plugins.paths")) paths = recipe.getStringList("plugins.paths");
  } catch (const ConfigError&) {
    *whyNot = "trainer.name or plugins.paths is malformed";
    return false;
  }
  // The plugins' keys are read off the recipe's core keys (precision.name,
  // the parallel sizes, ...), defaults filled.
  Recipe probe = recipe;
  {
    Schema core;
    describeCoreKeys(core);
    probe.validateAll(core, /*allowUnknown=*/true);
  }
  std::unique_ptr<PluginRegistry> registry;
  try {
    registry = std::make_unique<PluginRegistry>(PluginRegistry::defaultSearchPath(paths));
    PluginContext ctx;
    ctx.logger = logger();
    ctx.recipe = &recipe;
    ctx.world_size = std::max(1, worldSize);
    std::unique_ptr<Plugin> plugin = registry->create(plugin_kind::kTrainer, name, ctx, "trainer.name");
    addPluginKeys(schema, probe, *registry, static_cast<const Trainer*>(plugin.get()));
    if (trainerOut != nullptr) *trainerOut = std::move(plugin);
    return true;
  } catch (const PluginLoadError& e) {
    *whyNot = e.what();
    // The other plugins' keys still count: only the trainer's are missing.
    try {
      if (registry) addPluginKeys(schema, probe, *registry, nullptr);
    } catch (const Error&) {
    }
    return false;
  }
}

namespace {

double hostMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024.0;
  }
  return 0;
}

// Each layout the job runs, with the words that name it in a message: its
// own, or each device group's.
std::vector<std::pair<std::string, LayoutRequest>> runLayouts(const LayoutRequest& job) {
  if (job.groups.empty()) return {{"the layout", job}};
  std::vector<std::pair<std::string, LayoutRequest>> out;
  const DeviceGroups groups = deviceGroupsOf(job);
  for (size_t i = 0; i < job.groups.size(); ++i)
    out.emplace_back("device group " + groups[static_cast<int>(i)].name + "'s layout", groupRequest(job, i));
  return out;
}

// "; model.seq_length 600001 comes from ...": the sizes the trainer took
// from the data, after a memory refusal, so that it names their source.
std::string derivedSizesNote(const Trainer& trainer) {
  std::string out;
  for (const auto& note : trainer.derivedSizes()) out += "; " + note;
  return out;
}

}  // namespace

std::string hostMemoryRefusal(const std::string& recipePath, const PreparedRecipe& prepared) {
  const Recipe& recipe = prepared.recipe;
  if (recipe.getString("device.type") == "cuda") return "";
  const double have = hostMemoryBytes();
  if (have <= 0) return "";
  double need = 0;
  std::string whose;  // the layout that needs the most
  try {
    for (const auto& [name, request] : runLayouts(layoutRequestFromRecipe(recipe, prepared.world_size))) {
      const plan::Layout layout = planLayoutOf(recipe, planLayout(request));
      plan::DeviceSpec host;
      host.name = "host";
      host.memory_gib = have / (1024.0 * 1024.0 * 1024.0);
      const Trainer& trainer = *prepared.trainer;
      double own = 0;
      if (const auto shape = trainer.modelShape()) {
        own = plan::peakMemory(*shape, layout, host).total();
      } else {
        for (int64_t stage : {int64_t{0}, static_cast<int64_t>(layout.pp - 1)}) {
          if (const auto estimate = trainer.stageMemory(layout, stage)) own = std::max(own, estimate->total());
        }
      }
      if (whose.empty() || own > need) {
        need = own;
        whose = name;
      }
    }
  } catch (const Error&) {
    return "";  // the plan cannot size this model: its first allocation will say
  }
  if (!(need > have)) return "";
  return recipePath + ": " + whose + " is predicted to need " + memoryText(need) + " per rank, and this host has " +
         memoryText(have) + " in all: make the model, batch or sequence smaller, or split it over more ranks "
         "(`ptrain plan RECIPE` shows where the memory goes)" +
         derivedSizesNote(*prepared.trainer);
}

namespace {

int report(const std::vector<std::string>& problems) {
  for (const auto& p : problems) std::fprintf(stderr, "ptrain: %s\n", p.c_str());
  return 2;
}

// "pipeline: 1f1b, blocks per stage [1, 1], bubble (pp-1)/m = 0.25, at most
// 2 micro-batches alive per stage" for a layout `checkLayout` accepted.
void printPipeline(const Recipe& recipe, const LayoutPlan& plan) {
  const LayoutSizes& s = plan.sizes;
  const int stages = s.pp * s.vpp;
  std::vector<int64_t> blocks;
  if (recipe.has("parallel.pipeline_layout")) {
    blocks = recipe.getIntList("parallel.pipeline_layout");
  } else if (recipe.has("model.num_layers")) {
    blocks.assign(static_cast<size_t>(stages), recipe.getInt("model.num_layers") / stages);
  }
  std::string perStage;
  for (size_t i = 0; i < blocks.size(); ++i) perStage += (i ? ", " : "") + std::to_string(blocks[i]);
  const auto kind = pipeline::scheduleFromName(recipe.getString("parallel.pipeline_schedule"));
  const int m = static_cast<int>(plan.micro_batches);
  int alive = 0;
  for (int r = 0; r < s.pp; ++r) alive = std::max(alive, pipeline::maxInFlight(pipeline::buildSchedule(kind, s.pp, s.vpp, m, r)));
  std::printf("pipeline: %s, blocks per %sstage [%s], bubble %s = %.3g, at most %d %s alive per stage\n",
              pipeline::toString(kind), s.vpp > 1 ? "virtual " : "", perStage.c_str(),
              kind == pipeline::ScheduleKind::kInterleaved ? "(pp-1)/(vpp*m)" : "(pp-1)/m",
              pipeline::bubbleFormula(kind, s.pp, s.vpp, m), alive,
              s.vpp > 1 ? "chunk micro-batches" : (alive == 1 ? "micro-batch" : "micro-batches"));
}

}  // namespace

int cmdCheck(const CheckArgs& args) {
  // `parallel: auto`: what `ptrain run` would choose, then checked as if written.
  std::vector<std::string> overrides = args.overrides;
  std::string chosen;
  for (auto& o : autoLayoutOverrides(args.recipe, args.overrides, args.nproc, 1, &chosen)) overrides.push_back(std::move(o));
  if (!chosen.empty()) std::printf("%s\n", chosen.c_str());
  Recipe recipe = Recipe::load(args.recipe, overrides);
  Schema schema;
  describeCoreKeys(schema);
  std::string whyNot;
  int requestedWorld = args.nproc;
  if (requestedWorld <= 0) {
    try {
      requestedWorld = recipe.has("launch.nproc") ? static_cast<int>(recipe.getInt("launch.nproc")) : 1;
    } catch (const ConfigError&) {
      requestedWorld = 1;  // malformed: validation below reports it
    }
  }
  const bool trainerKeys = extendSchemaFromTrainer(recipe, schema, &whyNot, nullptr, requestedWorld);

  // Without its trainer, the keys it would declare cannot be told from
  // unknown ones: only the rest is checked (and the trainer's absence said).
  std::vector<std::string> problems = recipe.validateAll(schema, /*allowUnknown=*/!trainerKeys);
  // `run` cannot start without its trainer: neither can check pass.
  if (!trainerKeys && recipe.has("trainer.name")) {
    std::string why = whyNot;
    if (why.rfind("trainer.name: ", 0) == 0) why = why.substr(std::string("trainer.name: ").size());
    problems.insert(problems.begin(), recipe.location("trainer.name").str() + ": trainer.name: " + why);
  }
  // The schema takes communication.nccl as a free-form map; its entries are
  // NCCL's variables, checked against NCCL's table.
  for (auto& p : nccl::checkRecipe(recipe)) problems.push_back(std::move(p));
  if (!problems.empty()) return report(problems);

  const int world = args.nproc > 0 ? args.nproc : static_cast<int>(recipe.getInt("launch.nproc"));
  const LayoutRequest layout = layoutRequestFromRecipe(recipe, world);
  problems = checkLayout(layout);
  // As in `run`: a size no installed plugin executes is refused, not ignored.
  try {
    PluginRegistry registry(PluginRegistry::defaultSearchPath(recipe.getStringList("plugins.paths")));
    for (auto& p : checkParallelPlugins(layout, registry)) problems.push_back(std::move(p));
    for (auto& p : checkPrecision(recipe, registry)) problems.push_back(std::move(p));
    for (auto& p : checkMoeSettings(recipe)) problems.push_back(std::move(p));
    for (auto& p : checkMemorySettings(recipe)) problems.push_back(std::move(p));
    for (auto& p : checkOffload(recipe)) problems.push_back(std::move(p));
    for (auto& p : checkOffloadFolder(recipe, "")) problems.push_back(std::move(p));
  } catch (const PluginLoadError& e) {
    problems.push_back(e.what());
  }
  if (!problems.empty()) return report(problems);
  std::vector<std::string> warnings = layoutWarnings(layout);
  {
    const LayoutPlan sized = planLayout(layout);
    for (auto& w : memorySettingWarnings(recipe, sized.dp, sized.edp)) warnings.push_back(std::move(w));
  }
  for (const auto& w : warnings) std::fprintf(stderr, "ptrain: warning: %s\n", w.c_str());
  // Everything `ptrain run` refuses before it starts a worker, the trainer's
  // judgement of values fine alone but not together included (a sequence too
  // short for the dataset's problems): the same preparation, so that check
  // and run cannot disagree. What it throws goes to cli::main, which prints
  // each line as run's refusal does.
  const PreparedRecipe prepared = prepareRecipe(args.recipe, overrides, world);
  // Sized for another device (--device, --cluster): that check follows.
  if (args.device.empty() && args.cluster.empty()) {
    const std::string overMemory = hostMemoryRefusal(args.recipe, prepared);
    if (!overMemory.empty()) throw OutOfMemoryError(overMemory);
  }
  if (!args.device.empty() || !args.cluster.empty()) {
    int64_t count = 0;
    const plan::DeviceSpec device = resolvePlanDevice(args.cluster, args.device, &count, world);
    const auto shape = prepared.trainer->modelShape();
    if (!shape) {
      return report({recipe.location("trainer.name").str() + ": trainer.name: --device and --cluster need the "
                     "trainer's model shape, and this trainer has none to give"});
    }
    // Device groups: the group whose layout needs the most.
    std::optional<plan::Layout> planned;
    double need = 0;
    std::string whose;
    for (const auto& [name, request] : runLayouts(layout)) {
      const plan::Layout own = planLayoutOf(recipe, planLayout(request));
      const double ownNeed = plan::peakMemory(*shape, own, device).total();
      if (!planned || ownNeed > need) {
        planned = own;
        need = ownNeed;
        whose = name;
      }
    }
    const double have = device.memory_gib * 1024.0 * 1024.0 * 1024.0;
    if (need > have) {
      // The flowchart's first step, and the step at which it fits.
      const auto advice = plan::adviseWhenOverMemory(*shape, *planned, device);
      std::string fix = "split the model over more devices (tensor or pipeline parallelism)";
      if (!advice.empty()) {
        fix = "start with " + advice.front().override_text;
        const auto fits = std::find_if(advice.begin(), advice.end(), [](const plan::Advice& a) { return a.fits; });
        fix += fits == advice.end() ? "; even every lever leaves it over: more devices (tp, pp)"
                                    : "; it fits from " + fits->override_text + " on";
      }
      return report({args.recipe + ": " + whose + " is predicted to need " + memoryText(need) + " per rank, " +
                     device.name + " has " + memoryText(have) + ": " + fix + " (`ptrain plan` lists each step)" +
                     derivedSizesNote(*prepared.trainer)});
    }
  }

  const LayoutPlan plan = planLayout(layout);
  const LayoutSizes& s = plan.sizes;
  std::printf("%s: OK\n", args.recipe.c_str());
  if (!layout.groups.empty()) {
    // Each device group's own layout and rows (docs/planning.md).
    const DeviceGroups groups = deviceGroupsOf(layout);
    for (size_t i = 0; i < layout.groups.size(); ++i) {
      const DeviceGroup& g = groups[static_cast<int>(i)];
      const LayoutPlan own = planLayout(groupRequest(layout, i));
      const std::string chunks = own.sizes.vpp > 1 ? " vpp " + std::to_string(own.sizes.vpp) + " (interleaved)" : "";
      const std::string experts = own.sizes.ep > 1 || own.sizes.etp > 1
                                      ? " ep " + std::to_string(own.sizes.ep) + " etp " + std::to_string(own.sizes.etp)
                                      : "";
      const std::string ranks = g.sizes.world == 1 ? "rank " + std::to_string(g.first_rank)
                                                   : "ranks " + std::to_string(g.first_rank) + "-" +
                                                         std::to_string(g.first_rank + g.sizes.world - 1);
      std::printf("group %s: %s, tp %d pp %d%s dp %d%s, %lld rows, micro %lld, micro-batches per rank %lld\n",
                  g.name.c_str(), ranks.c_str(), own.sizes.tp, own.sizes.pp,
                  chunks.c_str(), own.dp, experts.c_str(),
                  static_cast<long long>(own.global_batch_size), static_cast<long long>(own.micro_batch_size),
                  static_cast<long long>(own.micro_batches));
    }
  }
  if (layout.groups.empty()) {
    std::printf("layout: world=%d tp=%d pp=%d dp=%d cp=%d ep=%d etp=%d edp=%d", s.world, s.tp, s.pp, plan.dp, s.cp,
                s.ep, s.etp, plan.edp);
    if (s.vpp > 1) std::printf(" vpp=%d", s.vpp);
    std::printf("\n");
    std::printf("batch: global=%lld micro=%lld%s micro-batches per step=%lld\n",
                static_cast<long long>(plan.global_batch_size), static_cast<long long>(plan.micro_batch_size),
                plan.micro_batch_size_derived ? " (global/dp)" : "", static_cast<long long>(plan.micro_batches));
  }
  if (recipe.has("parallel.data_parallel_shares")) {
    std::string rows;
    for (int64_t r : plan.data_rows) rows += (rows.empty() ? "" : ", ") + std::to_string(r);
    std::printf("data-parallel shares: rows per rank [%s] (the fewest micro-batches above)\n", rows.c_str());
  }
  const std::string trainer = recipe.getString("trainer.name");
  // An unknown trainer was refused above: its keys were checked.
  std::printf("trainer: %s\n", trainer.c_str());
  if (s.pp > 1 && layout.groups.empty()) printPipeline(recipe, plan);
  // What `ptrain run` will export, with this shell's environment winning.
  for (const auto& setting : nccl::effectiveSettings(nccl::settingsFromRecipe(recipe), nccl::processEnvironment())) {
    std::printf("nccl: %s\n", nccl::headerLine(setting).c_str());
  }
  return 0;
}

}  // namespace ptrain::cli

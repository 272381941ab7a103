#include "ptrain/engine/recipe_schema.h"

#include <algorithm>
#include <set>

#include "ptrain/core/logging.h"
#include "ptrain/engine/parallel_plugins.h"
#include "ptrain/engine/recipe_layout.h"
#include "ptrain/engine/trainer.h"
#include "ptrain/plugin/registry.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain {
namespace {

std::string ownerOf(const PluginInfo& p) { return p.kind + "/" + p.name; }

// The keys `info` declares, as a schema of their own.
Schema keysOf(const PluginInfo& info) {
  Schema own;
  if (info.keys != nullptr) own.addFrom(ownerOf(info), [&](Schema& s) { info.keys(s); });
  return own;
}

// A model with experts, as far as the core can tell before the trainer's keys
// are known: the expert sizes, or model.num_experts written above 0.
bool writesExperts(const Recipe& probe) {
  try {
    if (probe.getInt("parallel.expert_model_parallel_size") > 1) return true;
    if (probe.isExplicit("model.num_experts")) return std::stoll(probe.valueText("model.num_experts")) > 0;
  } catch (const std::exception&) {
    // Malformed: validation against the full schema reports it.
  }
  return false;
}

}  // namespace

void addPluginKeys(Schema& schema, const Recipe& probe, PluginRegistry& registry, const Trainer* trainer) {
  const std::string trainerName = probe.has("trainer.name") ? probe.getString("trainer.name") : "";
  const std::string precision = probe.getString("precision.name");
  const std::string offload = probe.getString("offload.name");
  const std::string backend = probe.getString("communication.backend");

  // The layout's parallel plugins. A layout the core refuses (sizes that do
  // not divide the world) still names its dimensions here: that refusal is
  // checkLayout's to say.
  LayoutSizes sizes;
  try {
    sizes.tp = static_cast<int>(probe.getInt("parallel.tensor_model_parallel_size"));
    sizes.cp = static_cast<int>(probe.getInt("parallel.context_parallel_size"));
    sizes.pp = static_cast<int>(probe.getInt("parallel.pipeline_model_parallel_size"));
    sizes.ep = static_cast<int>(probe.getInt("parallel.expert_model_parallel_size"));
    sizes.etp = static_cast<int>(probe.getInt("parallel.expert_tensor_parallel_size"));
  } catch (const ConfigError&) {
  }
  const std::vector<std::string> parallel = pickParallelPlugins(sizes, writesExperts(probe), registry).plugins;

  // Why a plugin's keys are not read, and what would choose it.
  auto unusedWhy = [&](const PluginInfo& p) -> std::string {
    const std::string owner = ownerOf(p);
    if (p.kind == plugin_kind::kPrecision) {
      return "applies to plugin " + owner + " only, and precision.name is " + precision +
             "; remove it or set precision.name: " + p.name;
    }
    if (p.kind == plugin_kind::kOffload) {
      return "applies to plugin " + owner + " only, and offload.name is " + offload +
             "; remove it or set offload.name: " + p.name;
    }
    if (p.kind == plugin_kind::kComm) {
      return "applies to plugin " + owner + " only, and communication.backend is " + backend +
             "; remove it or set communication.backend: " + p.name;
    }
    if (p.kind == plugin_kind::kTrainer) {
      return "applies to plugin " + owner + " only, and trainer.name is " + trainerName + "; remove it";
    }
    std::string dims;
    for (const auto& d : p.executes) dims += (dims.empty() ? "" : ", ") + d;
    return "applies to plugin " + owner + " only, which executes " + dims +
           ", and this layout does not use it; remove it, or set that size above 1";
  };

  for (const PluginInfo& p : registry.plugins()) {
    bool used = false;
    if (p.kind == plugin_kind::kTrainer) used = p.name == trainerName;
    else if (p.kind == plugin_kind::kPrecision) used = p.name == precision;
    else if (p.kind == plugin_kind::kOffload) used = p.name == offload;
    else if (p.kind == plugin_kind::kComm) used = backend == "auto" || p.name == backend;
    else if (p.kind == plugin_kind::kParallel)
      used = std::find(parallel.begin(), parallel.end(), p.name) != parallel.end();
    if (p.keys == nullptr) continue;
    if (used) {
      schema.addFrom(ownerOf(p), [&](Schema& s) { p.keys(s); });
    } else {
      const std::string why = unusedWhy(p);
      const Schema own = keysOf(p);
      for (const KeySpec& k : own.keys()) schema.addUnused(k.path, why);
    }
  }
  if (trainer != nullptr) {
    schema.addFrom("trainer/" + trainerName, [&](Schema& s) { trainer->describeKeys(s); });
  }
}

Schema installedKeys(PluginRegistry& registry, bool withTrainers) {
  Schema schema;
  describeCoreKeys(schema);
  for (const PluginInfo& p : registry.plugins()) {
    if (p.keys == nullptr || (p.kind == plugin_kind::kTrainer && !withTrainers)) continue;
    schema.addFrom(ownerOf(p), [&](Schema& s) { p.keys(s); });
  }
  return schema;
}

}  // namespace ptrain

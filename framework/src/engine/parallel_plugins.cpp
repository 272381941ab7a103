#include "ptrain/engine/parallel_plugins.h"

#include <algorithm>
#include <climits>

#include "ptrain/plugin/plugin.h"
#include "ptrain/plugin/registry.h"

namespace ptrain {
namespace {

// Only "above 1" matters here, so huge sizes (refused by checkLayout anyway)
// are clamped rather than wrapped.
int clampSize(int64_t n) { return static_cast<int>(std::min<int64_t>(n, INT_MAX)); }

}  // namespace

std::vector<std::string> parallelPluginsFor(const LayoutSizes& sizes, bool experts) {
  std::vector<std::string> names;
  if (sizes.tp > 1) names.push_back("tensor");
  if (sizes.cp > 1) names.push_back("context");
  if (experts || sizes.ep > 1 || sizes.etp > 1) names.push_back("expert");
  if (sizes.pp > 1) names.push_back("pipeline");
  names.push_back("data");
  return names;
}

std::vector<std::string> checkParallelPlugins(const LayoutRequest& request, PluginRegistry& registry) {
  // The dense model ignores the expert sizes (layoutWarnings says so, and
  // checkLayout refuses ep > 1 there).
  const bool moe = request.num_experts.value_or(0) > 0;
  LayoutSizes sizes;
  sizes.world = clampSize(request.world);
  sizes.tp = clampSize(request.tp);
  sizes.cp = clampSize(request.cp);
  sizes.pp = clampSize(request.pp);
  sizes.vpp = clampSize(request.vpp);
  sizes.ep = moe ? clampSize(request.ep) : 1;
  sizes.etp = moe ? clampSize(request.etp) : 1;

  // The size keys each plugin executes.
  struct Dimension {
    const char* plugin;
    const char* key;
    int64_t size;
  };
  const std::vector<Dimension> dimensions = {
      {"tensor", "parallel.tensor_model_parallel_size", request.tp},
      {"context", "parallel.context_parallel_size", request.cp},
      {"expert", "parallel.expert_model_parallel_size", sizes.ep},
      {"expert", "parallel.expert_tensor_parallel_size", sizes.etp},
      {"pipeline", "parallel.pipeline_model_parallel_size", request.pp},
  };
  auto where = [&](const std::string& key) { return request.where ? request.where(key) + ": " : std::string(); };

  const std::vector<PluginInfo>& found = registry.plugins();
  auto installed = [&](const std::string& name) {
    return std::any_of(found.begin(), found.end(), [&](const PluginInfo& p) {
      return p.kind == plugin_kind::kParallel && p.name == name;
    });
  };

  std::vector<std::string> out;
  for (const std::string& name : parallelPluginsFor(sizes, moe)) {
    if (installed(name)) continue;
    const std::string missing = "parallel/" + name + " is not installed";
    if (name == "data") {
      out.push_back(where("plugins.paths") + "no parallel plugin reduces the gradients across ranks (" + missing +
                    ", and every run needs it); add its folder to plugins.paths or PTRAIN_PLUGIN_PATH");
      continue;
    }
    if (name == "expert" && sizes.ep == 1 && sizes.etp == 1) {
      out.push_back(where("model.num_experts") + "a MoE model needs the plugin that places its experts (" + missing +
                    "); add its folder to plugins.paths or PTRAIN_PLUGIN_PATH, or set num_experts to 0");
      continue;
    }
    for (const auto& d : dimensions) {
      if (d.plugin != name || d.size <= 1) continue;
      const std::string shortKey = std::string(d.key).substr(std::string(d.key).find('.') + 1);
      out.push_back(where(d.key) + shortKey + "=" + std::to_string(d.size) + ": no parallel plugin executes it (" +
                    missing + "); set it to 1");
    }
  }
  return out;
}

}  // namespace ptrain

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

std::vector<std::string> layoutDimensionsUsed(const LayoutSizes& sizes, bool experts) {
  std::vector<std::string> dims;
  if (sizes.tp > 1) dims.push_back("tp");
  if (sizes.cp > 1) dims.push_back("cp");
  if (experts || sizes.ep > 1) dims.push_back("ep");
  if (sizes.etp > 1) dims.push_back("etp");
  if (sizes.pp > 1) dims.push_back("pp");
  dims.push_back("dp");
  return dims;
}

ParallelPluginPick pickParallelPlugins(const LayoutSizes& sizes, bool experts, PluginRegistry& registry) {
  ParallelPluginPick pick;
  const std::vector<PluginInfo>& found = registry.plugins();
  for (const std::string& dim : layoutDimensionsUsed(sizes, experts)) {
    auto it = std::find_if(found.begin(), found.end(), [&](const PluginInfo& p) {
      return p.kind == plugin_kind::kParallel && std::find(p.executes.begin(), p.executes.end(), dim) != p.executes.end();
    });
    if (it == found.end()) {
      pick.missing.push_back(dim);
    } else if (std::find(pick.plugins.begin(), pick.plugins.end(), it->name) == pick.plugins.end()) {
      pick.plugins.push_back(it->name);
    }
  }
  return pick;
}

std::vector<std::string> checkParallelPlugins(const LayoutRequest& request, PluginRegistry& registry) {
  if (!request.groups.empty()) {
    // Every device group's own layout, each problem once.
    std::vector<std::string> out;
    for (size_t i = 0; i < request.groups.size(); ++i) {
      for (auto& line : checkParallelPlugins(groupRequest(request, i), registry))
        if (std::find(out.begin(), out.end(), line) == out.end()) out.push_back(std::move(line));
    }
    return out;
  }
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

  // The size key of each dimension.
  struct Dimension {
    const char* dim;
    const char* key;
    int64_t size;
  };
  const std::vector<Dimension> dimensions = {
      {"tp", "parallel.tensor_model_parallel_size", request.tp},
      {"cp", "parallel.context_parallel_size", request.cp},
      {"ep", "parallel.expert_model_parallel_size", sizes.ep},
      {"etp", "parallel.expert_tensor_parallel_size", sizes.etp},
      {"pp", "parallel.pipeline_model_parallel_size", request.pp},
  };
  auto where = [&](const std::string& key) { return request.where ? request.where(key) + ": " : std::string(); };

  std::vector<std::string> out;
  for (const std::string& dim : pickParallelPlugins(sizes, moe, registry).missing) {
    if (dim == "dp") {
      out.push_back(where("plugins.paths") + "no installed parallel plugin executes dp, which reduces the gradients "
                    "across ranks (every run needs it: parallel/data is built in); add its folder to plugins.paths "
                    "or PTRAIN_PLUGIN_PATH");
      continue;
    }
    if (dim == "ep" && sizes.ep == 1) {
      out.push_back(where("model.num_experts") + "a MoE model needs a parallel plugin that places its experts (none "
                    "installed executes ep); add its folder to plugins.paths or PTRAIN_PLUGIN_PATH, or set "
                    "num_experts to 0");
      continue;
    }
    for (const auto& d : dimensions) {
      if (d.dim != dim) continue;
      const std::string shortKey = std::string(d.key).substr(std::string(d.key).find('.') + 1);
      out.push_back(where(d.key) + shortKey + "=" + std::to_string(d.size) + ": no installed parallel plugin executes " +
                    dim + "; set it to 1");
    }
  }
  return out;
}

}  // namespace ptrain

// Which parallel plugins execute a layout, found by the dimensions they
// declare (PluginDescriptor::executes), and whether every dimension has one.
//
// A layout dimension above 1 runs only if a parallel plugin executes it; a
// size that no plugin executes would silently repeat the same work on every
// rank of that dimension, so it is refused before anything starts. The
// engine knows no plugin by name: any installed parallel plugin that declares
// a dimension can execute it (the first in search order: plugins.paths, then
// PTRAIN_PLUGIN_PATH, then the built-in folder, so a plugin of one's own
// replaces a built-in one).
//
// Thread-safety: layoutDimensionsUsed is a pure function; the others use the
// registry, which belongs to one thread.
#pragma once

#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/layout/parallel_layout.h"
#include "ptrain/layout/validation.h"

namespace ptrain {

class PluginRegistry;

// The dimensions `sizes` needs executed, in the order their plugins are
// applied: "tp" if tp > 1, "cp" if cp > 1, "ep" for a model with experts (any
// ep: its plugin places them and reports their figures) or ep > 1, "etp" if
// etp > 1, "pp" if pp > 1, and "dp" last, always (a no-op at dp = 1).
PTRAIN_API std::vector<std::string> layoutDimensionsUsed(const LayoutSizes& sizes, bool experts = false);

// The parallel plugins that execute `sizes`, in order of application, each
// once (a plugin may execute several dimensions), and the dimensions no
// installed plugin executes.
struct ParallelPluginPick {
  std::vector<std::string> plugins;  // plugin names (kind "parallel")
  std::vector<std::string> missing;  // dimensions, as layoutDimensionsUsed names them
};
// Only looks the plugins up (PluginRegistry::plugins()); creates none. Throws
// PluginLoadError when the registry cannot scan its search path.
PTRAIN_API ParallelPluginPick pickParallelPlugins(const LayoutSizes& sizes, bool experts, PluginRegistry& registry);

// One line per dimension of `request` (its sizes; ep and etp count only for a
// MoE model, as planLayout says) that no installed plugin executes, in order;
// empty when every one has its plugin. A size above 1 is blamed at its key:
//   r.yaml:6:3: context_parallel_size=2: no installed parallel plugin executes cp; set it to 1
PTRAIN_API std::vector<std::string> checkParallelPlugins(const LayoutRequest& request, PluginRegistry& registry);

}  // namespace ptrain

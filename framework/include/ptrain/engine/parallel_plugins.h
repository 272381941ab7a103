// Which parallel plugins a layout needs, and whether they are installed.
//
// A layout dimension above 1 runs only if a parallel plugin executes it; a
// size that no plugin executes would silently repeat the same work on every
// rank of that dimension, so it is refused before anything starts.
//
// Thread-safety: parallelPluginsFor is a pure function; checkParallelPlugins
// uses the registry, which belongs to one thread.
#pragma once

#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/layout/parallel_layout.h"
#include "ptrain/layout/validation.h"

namespace ptrain {

class PluginRegistry;

// The parallel plugins (kind "parallel") the layout needs, in the order they
// are applied: "tensor" if tp > 1, "context" if cp > 1, "expert" for a model
// with experts (any ep: it places them and reports their figures) or ep > 1
// or etp > 1, "pipeline" if pp > 1, and "data" last, always (it is a no-op
// at dp = 1).
PTRAIN_API std::vector<std::string> parallelPluginsFor(const LayoutSizes& sizes, bool experts = false);

// One line per problem with the plugins `request` needs (parallelPluginsFor
// its sizes; ep and etp count only for a MoE model, as planLayout says), in
// that order; empty when `registry` finds every one. A size above 1 whose
// plugin is missing is blamed at its key:
//   r.yaml:6:3: context_parallel_size=2: no parallel plugin executes it (parallel/context is not installed); set it to 1
// Only looks the plugins up (PluginRegistry::plugins()); creates none.
// Throws PluginLoadError when the registry cannot scan its search path.
PTRAIN_API std::vector<std::string> checkParallelPlugins(const LayoutRequest& request, PluginRegistry& registry);

}  // namespace ptrain

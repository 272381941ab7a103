// Checks of the memory levers' keys (model.recompute, ...): settings that
// cannot work, one line each (location, key, what to change). `ptrain check`
// and `ptrain run` both ask it; docs/memory.md explains the levers.
#pragma once

#include <string>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain {

class Recipe;

// recompute_num_layers without recompute: full; recompute_num_layers above
// the blocks of a pipeline stage (num_layers / pipeline size, rounded up).
PTRAIN_API std::vector<std::string> checkMemorySettings(const Recipe& recipe);

// Settings that run but gain nothing, one line each: optimizer.distributed
// with a data-parallel size of 1 (dp, and edp for a model with experts):
// there is nothing to shard the states over.
PTRAIN_API std::vector<std::string> memorySettingWarnings(const Recipe& recipe, int64_t dp, int64_t edp);

}  // namespace ptrain

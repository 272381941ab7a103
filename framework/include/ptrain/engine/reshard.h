// Resharding in memory: one model's weights from the layout it trains on to
// the layout another runtime of the same model runs on, e.g. GRPO's actor at
// tp 2 x dp 2 into its rollout at tp 1 x dp 4 on the same four ranks,
// without a checkpoint round trip.
#pragma once

#include "ptrain/core/error.h"

namespace ptrain {

class ModelRuntime;

// Copies `from`'s parameters into `to`: two runtimes of one model (the same
// parameter names and full shapes) on one communicator's world, whose
// layouts may differ. Each parameter `from` splits is all-gathered over the
// groups it is split across that `to` does not split it across the same way
// (a split both share stays local), and each rank of `to` keeps its own
// slice, in `to`'s dtype and on its device. Collective over the world; every rank calls it with the same
// pair. Throws ConfigError when either layout has a pipeline (a stage holds
// only its own blocks; not supported yet), CheckpointError when a parameter
// of `to` is missing from `from` or has another full shape.
PTRAIN_API void reshardParameters(ModelRuntime& from, ModelRuntime& to);

}  // namespace ptrain

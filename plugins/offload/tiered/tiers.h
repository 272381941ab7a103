// The tiers of offload/tiered, one per kind of device; tiered.cpp hands the
// runtime the one for the device its model computes on.
#pragma once

#include <memory>

#include "ptrain/engine/offload.h"

namespace ptrain {

// cpu: memory-mapped files under the run folder (disk_tier.cpp).
std::unique_ptr<OffloadPlugin> makeDiskOffload(const PluginContext& ctx);
// cuda: pinned host memory, copies on a side stream (pinned_tier.cpp).
std::unique_ptr<OffloadPlugin> makePinnedOffload(const PluginContext& ctx);

}  // namespace ptrain

// The tiers of offload/tiered, one per kind of device; tiered.cpp hands the
// runtime the one for the device its model computes on.
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "ptrain/engine/offload.h"

namespace ptrain {

// What both tiers keep of a block's offloaded parameter.
struct RestingParameter {
  at::Tensor param;   // the model's tensor (its data moves)
  at::Tensor region;  // where it rests: a file's mapping, or pinned host memory
  int users = 0;      // nested uses in flight (a recomputation inside a backward)
};

// The bytes of a tensor's elements.
inline int64_t bytesOf(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// cpu: memory-mapped files under the run folder (disk_tier.cpp).
std::unique_ptr<OffloadPlugin> makeDiskOffload(const PluginContext& ctx);
// cuda: pinned host memory, copies on a side stream (pinned_tier.cpp).
std::unique_ptr<OffloadPlugin> makePinnedOffload(const PluginContext& ctx);

}  // namespace ptrain

#include "ptrain/engine/reshard.h"

#include <torch/torch.h>

#include <map>

#include "ptrain/comm/communicator.h"
#include "ptrain/comm/process_group.h"
#include "ptrain/engine/runtime.h"

namespace ptrain {
namespace {

// `local` gathered over `group` along `dim` (rank order = slice order).
at::Tensor allGatherAlong(const at::Tensor& local, ProcessGroup& group, int dim) {
  const at::Tensor front = local.transpose(0, dim).contiguous();
  std::vector<int64_t> sizes = front.sizes().vec();
  sizes[0] *= group.size();
  at::Tensor gathered = torch::empty(sizes, front.options());
  group.allgather(gathered, front)->wait();
  return gathered.transpose(0, dim).contiguous();
}

}  // namespace

void reshardParameters(ModelRuntime& from, ModelRuntime& to) {
  PTRAIN_CHECK_AS(ConfigError, from.layout().sizes().pp == 1 && to.layout().sizes().pp == 1,
                  "resharding '", from.name(), "' into '", to.name(), "': pipeline layouts are not supported yet ",
                  "(pp ", from.layout().sizes().pp, " and ", to.layout().sizes().pp, "); use pp 1 for both");
  torch::NoGradGuard noGrad;
  std::map<std::string, at::Tensor> targets;
  for (auto& [name, p] : to.model().localParameters()) targets.emplace(name, p);
  size_t copied = 0;
  // Every rank walks `from`'s parameters in the same order (without a
  // pipeline every rank has them all), so the gathers line up.
  for (auto& [name, p] : from.model().localParameters()) {
    const ParameterPlacement& source = from.model().placement.of(name);
    const ParameterPlacement& dest = to.model().placement.of(name);
    // A split both runtimes share (the same ranks, the same slice) stays
    // local; only the others are gathered, so a rank never holds more of a
    // parameter than the two layouts make it.
    auto shared = [&](const ShardSpec& spec) {
      const ShardSpec* other = dest.shardAlong(spec.axis);
      return other != nullptr && other->dim == spec.dim && other->num_shards == spec.num_shards &&
             other->index == spec.index &&
             from.groups().group(spec.axis)->globalRanks() == to.groups().group(spec.axis)->globalRanks();
    };
    at::Tensor part = p.detach();
    for (auto it = source.shards.rbegin(); it != source.shards.rend(); ++it) {
      if (!shared(*it)) part = allGatherAlong(part, *from.groups().group(it->axis), it->dim);
    }
    auto target = targets.find(name);
    if (target == targets.end()) continue;
    at::Tensor slice = part;
    for (const ShardSpec& spec : dest.shards) {
      const ShardSpec* had = source.shardAlong(spec.axis);
      if (had != nullptr && shared(*had)) continue;
      PTRAIN_CHECK_AS(CheckpointError, spec.dim < slice.dim() && slice.size(spec.dim) == spec.full_size,
                      "resharding '", from.name(), "' into '", to.name(), "': parameter ", name,
                      " has another size along dimension ", spec.dim, ": the two runtimes hold different models");
      const int64_t size = spec.full_size / spec.num_shards;
      slice = slice.narrow(spec.dim, spec.index * size, size);
    }
    PTRAIN_CHECK_AS(CheckpointError, slice.sizes() == target->second.sizes(), "resharding '", from.name(),
                    "' into '", to.name(), "': parameter ", name, " is ", slice.sizes(), " here but ",
                    target->second.sizes(), " there: the two runtimes hold different models");
    target->second.copy_(slice);
    ++copied;
  }
  PTRAIN_CHECK_AS(CheckpointError, copied == targets.size(), "resharding '", from.name(), "' into '", to.name(),
                  "': ", targets.size() - copied, " of its parameters are not in '", from.name(),
                  "': the two runtimes hold different models");
}

}  // namespace ptrain

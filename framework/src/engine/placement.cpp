#include "ptrain/engine/placement.h"

#include <torch/torch.h>

#include <sstream>

namespace ptrain {
namespace {

const ParameterPlacement kWhole{};

// The axes of a grid across which a parameter that is not split along them
// has the same value on every rank (pipeline stages hold different
// parameters, so the pipeline axis is never one of them).
std::vector<GroupKind> replicaAxes(ParamGrid grid) {
  if (grid == ParamGrid::kExpert) return {GroupKind::kExpertTensor, GroupKind::kExpert, GroupKind::kExpertData};
  return {GroupKind::kTensor, GroupKind::kContext, GroupKind::kData};
}

}  // namespace

const ShardSpec* ParameterPlacement::shardAlong(GroupKind axis) const {
  for (const auto& s : shards)
    if (s.axis == axis) return &s;
  return nullptr;
}

at::Tensor ParameterPlacement::sliceOfFull(const at::Tensor& full, const std::string& name) const {
  at::Tensor out = full;
  for (const auto& s : shards) {
    if (out.dim() <= s.dim || out.size(s.dim) != s.full_size) {
      std::ostringstream shape;
      shape << full.sizes();
      throw CheckpointError(detail::concat("parameter '", name, "' has shape ", shape.str(), ", not ", s.full_size,
                                           " along dim ", s.dim, ": the checkpoint is from another model"));
    }
    const int64_t size = s.full_size / s.num_shards;
    out = out.narrow(s.dim, s.index * size, size);
  }
  return out;
}

std::vector<int64_t> ParameterPlacement::fullSizes(at::IntArrayRef localSizes) const {
  std::vector<int64_t> sizes = localSizes.vec();
  for (const auto& s : shards) {
    if (s.dim < static_cast<int>(sizes.size())) sizes[static_cast<size_t>(s.dim)] = s.full_size;
  }
  return sizes;
}

std::vector<int64_t> ParameterPlacement::offsets(at::IntArrayRef localSizes) const {
  std::vector<int64_t> out(localSizes.size(), 0);
  for (const auto& s : shards) {
    if (s.dim < static_cast<int>(out.size())) out[static_cast<size_t>(s.dim)] = s.index * localSizes[s.dim];
  }
  return out;
}

const ParameterPlacement& Placement::of(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? kWhole : it->second;
}

ParameterPlacement& Placement::edit(const std::string& name) { return entries_[name]; }

void Placement::addShard(const std::string& name, const ShardSpec& spec) {
  ParameterPlacement& p = entries_[name];
  for (const auto& s : p.shards) {
    PTRAIN_CHECK(s.axis != spec.axis, "placement: '", name, "' is split along ", toString(spec.axis), " twice");
    PTRAIN_CHECK(s.dim != spec.dim, "placement: '", name, "' is split along dimension ", spec.dim, " by both ",
                 toString(s.axis), " and ", toString(spec.axis));
  }
  PTRAIN_CHECK(spec.num_shards >= 1 && spec.index >= 0 && spec.index < spec.num_shards &&
                   spec.full_size % spec.num_shards == 0,
               "placement: bad split of '", name, "': slice ", spec.index, " of ", spec.num_shards, ", full size ",
               spec.full_size);
  p.shards.push_back(spec);
}

std::vector<std::string> Placement::names() const {
  std::vector<std::string> out;
  for (const auto& [name, p] : entries_) out.push_back(name);
  return out;
}

GroupKind Placement::gradientReduceGroup(const ParameterPlacement& p, const ParallelLayout& layout) {
  if (p.grid == ParamGrid::kExpert) return GroupKind::kExpertData;
  return layout.cp() > 1 ? GroupKind::kDataContext : GroupKind::kData;
}

bool Placement::countedInNorm(const std::string& name, const ParallelLayout& layout, int rank,
                              bool dataPartitioned) const {
  const ParameterPlacement& p = of(name);
  if (!p.held || p.mirror) return false;
  for (GroupKind axis : replicaAxes(p.grid)) {
    const bool dataAxis = axis == GroupKind::kData || axis == GroupKind::kContext || axis == GroupKind::kExpertData;
    if (dataPartitioned && dataAxis) continue;
    if (p.shardAlong(axis) == nullptr && layout.indexIn(axis, rank) != 0) return false;
  }
  return true;
}

}  // namespace ptrain

// DeviceGroups: one training job over groups of devices of unequal speed
// (parallel.groups), each group holding a whole replica of the model in its
// own model-parallel layout (tp x pp, vpp) with its own micro-batch size and
// share of the global batch.
//
// Ranks are numbered group by group: the first group takes ranks
// 0..ranks-1, the next the following ones, and so on. Inside a group the
// ranks follow ParallelLayout's order (tp fastest) over the group's own
// rank count. The global batch is split by share (group g takes
// global * share_g / sum rows, in group order), then evenly over the
// group's data-parallel ranks in whole micro-batches of its size.
//
// How the replicas stay one model (engine/cross_group_gradients.h): each
// group reduces its gradients by its own layout, the groups then sum them
// over the job on the blocks each rank holds, so every group steps with the
// same gradient.
//
// Sizes only, like parallel_layout.h: engine/recipe_layout.h reads the
// groups from a recipe (deviceGroupsFromRecipe).
//
// Thread-safety: values; const methods only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/layout/parallel_layout.h"

namespace ptrain {

struct DeviceGroup {
  std::string name;                  // as written, else "group<i>"
  int first_rank = 0;                // the job's rank of the group's rank 0
  LayoutSizes sizes;                 // world: the group's rank count
  std::optional<int64_t> micro_batch_size;  // unset: train.micro_batch_size
  double share = 1;                  // weight in the split of the global batch
  std::string where;                 // "file:line:col" of the group's entry ("" when unknown)
};

class PTRAIN_API DeviceGroups {
 public:
  explicit DeviceGroups(std::vector<DeviceGroup> groups);

  const std::vector<DeviceGroup>& groups() const { return groups_; }
  int size() const { return static_cast<int>(groups_.size()); }
  const DeviceGroup& operator[](int index) const { return groups_[static_cast<size_t>(index)]; }
  // Ranks of every group together.
  int world() const;
  // The group holding job rank `rank`. Throws InternalError past world().
  int indexOf(int rank) const;
  // Rows [begin, end) of a global batch of `global` rows each group takes
  // (by share, in group order); nullopt when the shares give no whole rows.
  std::optional<std::vector<std::pair<int64_t, int64_t>>> rows(int64_t global) const;
  // One line: "a100: 4 ranks tp 2 pp 2, share 2; v100: 2 ranks tp 2, share 1".
  std::string describe() const;

 private:
  std::vector<DeviceGroup> groups_;
};

}  // namespace ptrain

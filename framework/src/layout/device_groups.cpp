#include "ptrain/layout/device_groups.h"

#include "ptrain/core/text.h"
#include "ptrain/layout/validation.h"

namespace ptrain {

DeviceGroups::DeviceGroups(std::vector<DeviceGroup> groups) : groups_(std::move(groups)) {
  int next = 0;
  for (size_t i = 0; i < groups_.size(); ++i) {
    if (groups_[i].name.empty()) groups_[i].name = "group" + std::to_string(i);
    groups_[i].first_rank = next;
    next += groups_[i].sizes.world;
  }
}

int DeviceGroups::world() const {
  int total = 0;
  for (const DeviceGroup& g : groups_) total += g.sizes.world;
  return total;
}

int DeviceGroups::indexOf(int rank) const {
  for (size_t i = 0; i < groups_.size(); ++i) {
    const DeviceGroup& g = groups_[i];
    if (rank >= g.first_rank && rank < g.first_rank + g.sizes.world) return static_cast<int>(i);
  }
  PTRAIN_CHECK(false, "rank ", rank, " is in no device group (", world(), " ranks in all)");
  return -1;
}

std::optional<std::vector<std::pair<int64_t, int64_t>>> DeviceGroups::rows(int64_t global) const {
  std::vector<double> shares;
  for (const DeviceGroup& g : groups_) shares.push_back(g.share);
  const auto counts = dataParallelRows(global, static_cast<int64_t>(groups_.size()), shares);
  if (!counts) return std::nullopt;
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  for (int64_t c : *counts) {
    out.emplace_back(begin, begin + c);
    begin += c;
  }
  return out;
}

std::string DeviceGroups::describe() const {
  std::string out;
  for (const DeviceGroup& g : groups_) {
    const LayoutSizes& s = g.sizes;
    std::string line = g.name + ": " + std::to_string(s.world) + " ranks tp " + std::to_string(s.tp);
    if (s.pp > 1) line += " pp " + std::to_string(s.pp);
    if (s.vpp > 1) line += " vpp " + std::to_string(s.vpp);
    if (s.ep > 1) line += " ep " + std::to_string(s.ep);
    const int dp = s.world / std::max(1, s.tp * s.cp * s.pp);
    if (dp > 1) line += " dp " + std::to_string(dp);
    line += ", share " + text::formatNumber(g.share);
    out += (out.empty() ? "" : "; ") + line;
  }
  return out;
}

}  // namespace ptrain

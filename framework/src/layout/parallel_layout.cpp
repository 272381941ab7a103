#include "ptrain/layout/parallel_layout.h"

#include <algorithm>
#include <sstream>

namespace ptrain {
namespace {

// Ranks are laid out as a mixed-radix number whose digits are the grid
// dimensions, fastest first (Megatron: tp, cp, ep, dp, pp). A group of a
// given kind varies the digits in `mask` and holds the others fixed; this is
// Megatron's generate_masked_orthogonal_rank_groups.
std::vector<std::vector<int>> maskedGroups(const std::vector<int>& dims, const std::vector<bool>& mask) {
  int world = 1;
  for (int d : dims) world *= d;
  std::vector<int> stride(dims.size(), 1);
  for (size_t i = 1; i < dims.size(); ++i) stride[i] = stride[i - 1] * dims[i - 1];

  std::vector<size_t> inGroup, across;
  int groupSize = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (mask[i]) {
      inGroup.push_back(i);
      groupSize *= dims[i];
    } else {
      across.push_back(i);
    }
  }
  const int numGroups = world / groupSize;

  auto decompose = [&](int index, const std::vector<size_t>& which) {
    std::vector<int> digits;
    for (size_t d : which) {
      digits.push_back(index % dims[d]);
      index /= dims[d];
    }
    return digits;
  };

  std::vector<std::vector<int>> groups;
  for (int g = 0; g < numGroups; ++g) {
    std::vector<int> fixed = decompose(g, across);
    int base = 0;
    for (size_t k = 0; k < across.size(); ++k) base += fixed[k] * stride[across[k]];
    std::vector<int> group;
    for (int m = 0; m < groupSize; ++m) {
      std::vector<int> varying = decompose(m, inGroup);
      int rank = base;
      for (size_t k = 0; k < inGroup.size(); ++k) rank += varying[k] * stride[inGroup[k]];
      group.push_back(rank);
    }
    groups.push_back(group);
  }
  // Members are listed in grid order (fastest dimension first), which is also
  // ascending; groups are ordered by their first rank.
  std::sort(groups.begin(), groups.end());
  return groups;
}

std::string divisorsOf(int n) {
  std::vector<int> ds;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) ds.push_back(d);
  std::ostringstream os;
  for (size_t i = 0; i < ds.size(); ++i) {
    if (i > 0) os << (i + 1 == ds.size() ? " or " : ", ");
    os << ds[i];
  }
  return os.str();
}

}  // namespace

const char* toString(GroupKind kind) {
  switch (kind) {
    case GroupKind::kTensor: return "tp";
    case GroupKind::kContext: return "cp";
    case GroupKind::kData: return "dp";
    case GroupKind::kPipeline: return "pp";
    case GroupKind::kDataContext: return "dp_cp";
    case GroupKind::kModel: return "mp";
    case GroupKind::kExpert: return "ep";
    case GroupKind::kExpertTensor: return "etp";
    case GroupKind::kExpertData: return "edp";
  }
  return "?";
}

ParallelLayout::ParallelLayout(const LayoutSizes& sizes) : sizes_(sizes) {
  const auto& s = sizes_;
  PTRAIN_CHECK_AS(ConfigError, s.world >= 1 && s.tp >= 1 && s.cp >= 1 && s.pp >= 1 && s.vpp >= 1 && s.ep >= 1 && s.etp >= 1,
                  "parallel sizes must be at least 1 (world=", s.world, " tp=", s.tp, " cp=", s.cp, " pp=", s.pp,
                  " vpp=", s.vpp, " ep=", s.ep, " etp=", s.etp, ")");
  const int model = s.tp * s.cp * s.pp;
  PTRAIN_CHECK_AS(ConfigError, s.world % model == 0, "world size ", s.world,
                  " is not divisible by tensor_model_parallel_size*context_parallel_size*pipeline_model_parallel_size=",
                  model, ": use a world size that is a multiple of ", model);
  dp_ = s.world / model;
  const int expert = s.etp * s.ep * s.pp;
  PTRAIN_CHECK_AS(ConfigError, s.world % expert == 0, "world size ", s.world,
                  " is not divisible by expert_tensor_parallel_size*expert_model_parallel_size*"
                  "pipeline_model_parallel_size=",
                  expert, ": use expert_model_parallel_size in ", divisorsOf(s.world / (s.etp * s.pp) > 0 ? s.world / (s.etp * s.pp) : 1));
  edp_ = s.world / expert;
}

std::vector<std::vector<int>> ParallelLayout::groups(GroupKind kind) const {
  const auto& s = sizes_;
  // Dense grid: tp, cp, dp, pp (Megatron's ep digit is 1 for dense layers).
  const std::vector<int> dense{s.tp, s.cp, dp_, s.pp};
  // Expert grid: etp, ep, edp, pp.
  const std::vector<int> expert{s.etp, s.ep, edp_, s.pp};
  switch (kind) {
    case GroupKind::kTensor: return maskedGroups(dense, {true, false, false, false});
    case GroupKind::kContext: return maskedGroups(dense, {false, true, false, false});
    case GroupKind::kData: return maskedGroups(dense, {false, false, true, false});
    case GroupKind::kPipeline: return maskedGroups(dense, {false, false, false, true});
    case GroupKind::kDataContext: return maskedGroups(dense, {false, true, true, false});
    case GroupKind::kModel: return maskedGroups(dense, {true, false, false, true});
    case GroupKind::kExpertTensor: return maskedGroups(expert, {true, false, false, false});
    case GroupKind::kExpert: return maskedGroups(expert, {false, true, false, false});
    case GroupKind::kExpertData: return maskedGroups(expert, {false, false, true, false});
  }
  return {};
}

std::vector<int> ParallelLayout::groupOf(GroupKind kind, int rank) const {
  PTRAIN_CHECK(rank >= 0 && rank < sizes_.world, "rank ", rank, " outside world of ", sizes_.world);
  for (auto& g : groups(kind)) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  }
  PTRAIN_CHECK(false, "rank ", rank, " is in no ", toString(kind), " group");
}

int ParallelLayout::indexIn(GroupKind kind, int rank) const {
  auto g = groupOf(kind, rank);
  return static_cast<int>(std::find(g.begin(), g.end(), rank) - g.begin());
}

std::string ParallelLayout::groupName(GroupKind kind, const std::vector<int>& ranks) {
  std::ostringstream os;
  os << toString(kind) << "[";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? "," : "") << ranks[i];
  os << "]";
  return os.str();
}

std::string ParallelLayout::describe() const {
  std::ostringstream os;
  os << "world=" << sizes_.world << " tp=" << sizes_.tp << " cp=" << sizes_.cp << " pp=" << sizes_.pp;
  if (sizes_.vpp > 1) os << " vpp=" << sizes_.vpp;
  os << " dp=" << dp_;
  if (sizes_.ep > 1 || sizes_.etp != sizes_.tp) os << " ep=" << sizes_.ep << " etp=" << sizes_.etp << " edp=" << edp_;
  return os.str();
}

}  // namespace ptrain

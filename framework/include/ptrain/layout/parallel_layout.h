// ParallelLayout: which ranks share a tensor, context, expert, data or
// pipeline group, following Megatron-LM's rank order (tp-cp-ep-dp-pp, tensor
// parallel fastest). Dense layers use the grid tp x cp x dp x pp; MoE layers
// use the expert grid etp x ep x edp x pp over the same ranks.
//
// Example (Megatron's documented case): 16 ranks, tp=2, pp=4 -> dp=2,
// tensor groups [0,1],[2,3],..., data groups [0,2],[1,3],[4,6],...,
// pipeline groups [0,4,8,12],[1,5,9,13],...
//
// Sizes only: engine/recipe_layout.h reads them from a recipe
// (layoutFromRecipe).
#pragma once

#include <string>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain {

struct LayoutSizes {
  int world = 1;
  int tp = 1;   // tensor_model_parallel_size
  int cp = 1;   // context_parallel_size
  int pp = 1;   // pipeline_model_parallel_size
  int vpp = 1;  // virtual_pipeline_model_parallel_size
  int ep = 1;   // expert_model_parallel_size
  int etp = 1;  // expert_tensor_parallel_size
};

// Which group of a rank.
enum class GroupKind { kTensor, kContext, kData, kPipeline, kDataContext, kModel,
                       kExpert, kExpertTensor, kExpertData };
PTRAIN_API const char* toString(GroupKind kind);

class PTRAIN_API ParallelLayout {
 public:
  // Throws ConfigError when the sizes do not split the world (each message
  // names both numbers and what would fit).
  explicit ParallelLayout(const LayoutSizes& sizes);

  const LayoutSizes& sizes() const { return sizes_; }
  int world() const { return sizes_.world; }
  int tp() const { return sizes_.tp; }
  int cp() const { return sizes_.cp; }
  int pp() const { return sizes_.pp; }
  int vpp() const { return sizes_.vpp; }
  int ep() const { return sizes_.ep; }
  int etp() const { return sizes_.etp; }
  int dp() const { return dp_; }    // world / (tp * cp * pp)
  int edp() const { return edp_; }  // world / (etp * ep * pp)

  // Every group of a kind, each sorted, in ascending order of first rank.
  std::vector<std::vector<int>> groups(GroupKind kind) const;
  // The group of `kind` holding `rank`.
  std::vector<int> groupOf(GroupKind kind, int rank) const;
  // This rank's coordinate along a dimension (its index within groupOf()).
  int indexIn(GroupKind kind, int rank) const;

  // Stable group name for stores and messages, e.g. "tp[2,3]".
  static std::string groupName(GroupKind kind, const std::vector<int>& ranks);
  // One line describing the layout, e.g. "world=8 tp=2 pp=2 dp=2 ...".
  std::string describe() const;

 private:
  LayoutSizes sizes_;
  int dp_ = 1;
  int edp_ = 1;
};

}  // namespace ptrain

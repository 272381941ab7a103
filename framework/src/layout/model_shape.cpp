#include "ptrain/layout/model_shape.h"

#include <algorithm>

namespace ptrain::plan {

int64_t Layout::microBatches() const {
  const int64_t perRank = global_batch / std::max<int64_t>(1, dp);
  return std::max<int64_t>(1, perRank / std::max<int64_t>(1, micro_batch));
}

}  // namespace ptrain::plan

// The recommender's batch layout, shared by every source of click samples
// (the generator's ClicksDataset::batch, Criteo files), so that equal samples
// give equal batches.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "ptrain/engine/batch.h"

namespace ptrain::datasets {

// sparse [B, 26] int64, dense [B, 13] float (log(1 + count)), history [B, H]
// int64 (-1 past the valid items), history_lengths [B] int64, labels [B]
// float, as the batch's "sparse", "dense", "history", "history_lengths" and
// "labels", plus what the model derives from them: "history_mask" (history
// >= 0, float), "item_categories" and "user_interests" (those features'
// columns of sparse).
Batch clicksBatchOf(at::Tensor sparse, at::Tensor dense, at::Tensor history, at::Tensor lengths, at::Tensor labels,
                    int64_t category_feature, int64_t interest_feature);

}  // namespace ptrain::datasets

// A recommender small enough for unit tests, shared by the tests that build
// its model (test_recommender_model.cpp, test_sharded_build.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "../../trainers/recommender/recsys_model.h"

namespace ptrain::recsys_fixture {

// 26 tables of 50 rows but the first two (300, 200 rows: row-wise at tp 2
// with row_wise_threshold 100, the others packed table-wise in 4 slots),
// width 4, `experts` experts (top-2, or top-1 for one).
inline recommender::RecsysConfig tinyConfig(int64_t experts) {
  recommender::RecsysConfig c;
  c.table_sizes = std::vector<int64_t>(recommender::kSparseFeatures, 50);
  c.table_sizes[0] = 300;
  c.table_sizes[1] = 200;
  c.dim = 4;
  c.bottom_mlp = {8};
  c.top_mlp = {8};
  c.attention_hidden = 6;
  c.hidden = 8;
  c.ffn = 12;
  c.history_length = 5;
  c.num_experts = experts;
  c.moe.topk = experts > 1 ? 2 : 1;
  c.row_wise_threshold = 100;
  c.table_wise_slots = 4;
  c.row_multiple = 4;
  return c;
}

}  // namespace ptrain::recsys_fixture

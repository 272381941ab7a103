// ClicksDataset::batch: the samples as cpu tensors. Apart from clicks.cpp so
// that the generator itself needs no torch.
#include "ptrain/datasets/clicks.h"
#include "ptrain/datasets/clicks_batch.h"

#include "ptrain/engine/batch.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>

namespace ptrain::datasets {
namespace {
// Samples per parallel chunk: each costs a few microseconds.
constexpr int64_t kGrain = 64;
}  // namespace

Batch ClicksDataset::batch(ClicksSplit split, int64_t first, int64_t count) const {
  PTRAIN_CHECK(first >= 0 && count >= 0, "clicks dataset: samples ", first, "+", count, " are out of range");
  const int64_t hl = options_.history_length;
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  at::Tensor sparse = torch::empty({count, kClicksSparseFeatures}, i64);
  at::Tensor dense = torch::empty({count, kClicksDenseFeatures}, f32);
  at::Tensor history = torch::empty({count, hl}, i64);
  at::Tensor lengths = torch::empty({count}, i64);
  at::Tensor labels = torch::empty({count}, f32);
  at::Tensor probabilities = torch::empty({count}, f32);
  int64_t* sp = sparse.data_ptr<int64_t>();
  float* de = dense.data_ptr<float>();
  int64_t* hi = history.data_ptr<int64_t>();
  int64_t* le = lengths.data_ptr<int64_t>();
  float* la = labels.data_ptr<float>();
  float* pr = probabilities.data_ptr<float>();
  // Every sample is a pure function of its index, so the split into chunks
  // does not change a value.
  at::parallel_for(0, count, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<double> scratch;
    int64_t counts[kClicksDenseFeatures];
    for (int64_t r = begin; r < end; ++r) {
      double p = 0;
      fill(split, first + r, sp + r * kClicksSparseFeatures, counts, hi + r * hl, le + r, &p, la + r, scratch);
      pr[r] = static_cast<float>(p);
      for (int64_t j = 0; j < kClicksDenseFeatures; ++j) {
        de[r * kClicksDenseFeatures + j] = static_cast<float>(std::log1p(static_cast<double>(counts[j])));
      }
    }
  });
  Batch b = clicksBatchOf(sparse, dense, history, lengths, labels, options_.category_feature,
                          options_.interest_feature);
  b.tensors.emplace("probabilities", probabilities);
  return b;
}

Batch clicksBatchOf(at::Tensor sparse, at::Tensor dense, at::Tensor history, at::Tensor lengths, at::Tensor labels,
                    int64_t category_feature, int64_t interest_feature) {
  Batch b;
  b.tensors.emplace("history_mask", history.ge(0).to(torch::kFloat32));
  b.tensors.emplace("item_categories", sparse.select(1, category_feature).contiguous());
  b.tensors.emplace("user_interests", sparse.select(1, interest_feature).contiguous());
  b.tensors.emplace("sparse", std::move(sparse));
  b.tensors.emplace("dense", std::move(dense));
  b.tensors.emplace("history", std::move(history));
  b.tensors.emplace("history_lengths", std::move(lengths));
  b.tensors.emplace("labels", std::move(labels));
  return b;
}

}  // namespace ptrain::datasets

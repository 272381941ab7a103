// megatron-core's BlendedDataset (blended_dataset.py, helpers.cpp
// build_blending_indices and build_exhaustive_blending_indices) and the
// per-data-set sizes BlendedMegatronDatasetBuilder asks for.
#include "ptrain/datasets/indexed_dataset.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>

#include "ptrain/core/error.h"
#include "ptrain/core/text.h"

namespace ptrain::datasets {

void buildBlendingIndices(const std::vector<double>& weights, int64_t size, std::vector<int16_t>* dataset_index,
                          std::vector<int64_t>* dataset_sample_index) {
  PTRAIN_CHECK(!weights.empty() && size >= 0, "buildBlendingIndices: ", weights.size(), " weights, size ", size);
  const auto n = static_cast<int64_t>(weights.size());
  dataset_index->assign(static_cast<size_t>(size), 0);
  dataset_sample_index->assign(static_cast<size_t>(size), 0);
  std::vector<int64_t> current(static_cast<size_t>(n), 0);
  for (int64_t sample = 0; sample < size; ++sample) {
    // Sample 0 is weighed as sample 1, so the heaviest data set goes first.
    const double at = std::max(static_cast<double>(sample), 1.0);
    int64_t max_index = 0;
    double max_error = weights[0] * at - static_cast<double>(current[0]);
    for (int64_t k = 1; k < n; ++k) {
      const double error = weights[static_cast<size_t>(k)] * at - static_cast<double>(current[static_cast<size_t>(k)]);
      if (error > max_error) {
        max_error = error;
        max_index = k;
      }
    }
    (*dataset_index)[static_cast<size_t>(sample)] = static_cast<int16_t>(max_index);
    (*dataset_sample_index)[static_cast<size_t>(sample)] = current[static_cast<size_t>(max_index)];
    ++current[static_cast<size_t>(max_index)];
  }
}

void buildExhaustiveBlendingIndices(const std::vector<int64_t>& sizes, std::vector<int16_t>* dataset_index,
                                    std::vector<int64_t>* dataset_sample_index) {
  PTRAIN_CHECK(!sizes.empty(), "buildExhaustiveBlendingIndices: no sizes");
  const auto n = static_cast<int32_t>(sizes.size());
  int64_t total = 0;
  std::set<int32_t> unspent;
  for (int32_t k = 0; k < n; ++k) {
    // A data set of size 0 would never be spent and the loop never end.
    PTRAIN_CHECK_AS(ConfigError, sizes[static_cast<size_t>(k)] > 0, "blend: data set ", k, " has no samples; give ",
                    "every data set of a blend data");
    total += sizes[static_cast<size_t>(k)];
    unspent.insert(k);
  }
  std::vector<double> weights(static_cast<size_t>(n));
  for (int32_t k = 0; k < n; ++k) {
    weights[static_cast<size_t>(k)] = static_cast<double>(sizes[static_cast<size_t>(k)]) / static_cast<double>(total);
  }
  std::vector<int64_t> counts(static_cast<size_t>(n), 0);
  dataset_index->assign(static_cast<size_t>(total), 0);
  dataset_sample_index->assign(static_cast<size_t>(total), 0);
  int64_t sample = 0;
  while (!unspent.empty()) {
    const double at = std::max(static_cast<double>(sample), 1.0);
    int64_t argmax = -1;
    double error_max = std::numeric_limits<double>::lowest();
    for (int32_t k : unspent) {
      const double error = weights[static_cast<size_t>(k)] * at - static_cast<double>(counts[static_cast<size_t>(k)]);
      if (error > error_max) {
        argmax = k;
        error_max = error;
      }
    }
    (*dataset_index)[static_cast<size_t>(sample)] = static_cast<int16_t>(argmax);
    (*dataset_sample_index)[static_cast<size_t>(sample)] = counts[static_cast<size_t>(argmax)];
    ++counts[static_cast<size_t>(argmax)];
    if (counts[static_cast<size_t>(argmax)] == sizes[static_cast<size_t>(argmax)]) {
      unspent.erase(static_cast<int32_t>(argmax));
    }
    ++sample;
  }
}

std::vector<int64_t> megatronBlendSizes(const std::vector<double>& normalized_weights, int64_t target,
                                        double surplus) {
  std::vector<int64_t> sizes;
  sizes.reserve(normalized_weights.size());
  for (double weight : normalized_weights) {
    // int(math.ceil(math.ceil(target_size * weight) * (1 + surplus)))
    const double planned = std::ceil(static_cast<double>(target) * weight);
    sizes.push_back(static_cast<int64_t>(std::ceil(planned * (1.0 + surplus))));
  }
  return sizes;
}

BlendedGptSamples::BlendedGptSamples(std::vector<std::shared_ptr<const IndexedDataset>> datasets,
                                     const std::vector<double>& weights, MegatronSplit split,
                                     std::optional<int64_t> num_samples, const GptBlendOptions& options) {
  const char* name = megatronSplitName(split);
  PTRAIN_CHECK_AS(ConfigError, !datasets.empty(), "a blend needs at least one data set");
  PTRAIN_CHECK_AS(ConfigError, datasets.size() < 32767, "a blend of ", datasets.size(),
                  " data sets; megatron's int16 dataset index holds at most 32766");
  PTRAIN_CHECK_AS(ConfigError, weights.empty() || weights.size() == datasets.size(), "a blend of ", datasets.size(),
                  " data sets with ", weights.size(), " weights; give one weight per data set (or none)");
  for (size_t k = 0; k < weights.size(); ++k) {
    PTRAIN_CHECK_AS(ConfigError, std::isfinite(weights[k]) && weights[k] > 0, "blend weight ", k, " (",
                    datasets[k] ? datasets[k]->pathPrefix() : std::string("?"), ") is ", weights[k],
                    "; every weight must be > 0 (leave a data set out instead)");
  }
  PTRAIN_CHECK_AS(ConfigError, weights.empty() || num_samples.has_value(), "a blend with weights needs the number of ",
                  name, " samples (megatron: using client-specified weights requires client-specified size)");
  PTRAIN_CHECK_AS(ConfigError, !num_samples || *num_samples >= 0, "cannot ask for ", *num_samples, " ", name,
                  " samples");

  if (datasets.size() == 1 && weights.empty()) {
    // megatron returns the one GPTDataset itself.
    datasets_.push_back(GptSamples::forSplit(datasets[0], options.split, split, num_samples, options.samples));
    const int64_t size = datasets_[0].size();
    dataset_index_.assign(static_cast<size_t>(size), 0);
    dataset_sample_index_.resize(static_cast<size_t>(size));
    std::iota(dataset_sample_index_.begin(), dataset_sample_index_.end(), int64_t{0});
    return;
  }

  if (!weights.empty()) {
    const std::vector<double> normalized = megatronNormalize(weights);
    const std::vector<int64_t> target = megatronBlendSizes(normalized, *num_samples, 0.0);
    const std::vector<int64_t> buffer = megatronBlendSizes(normalized, *num_samples, options.mid_level_dataset_surplus);
    for (size_t k = 0; k < datasets.size(); ++k) {
      datasets_.push_back(GptSamples::forSplit(datasets[k], options.split, split, buffer[k], options.samples));
    }
    const int64_t size = std::accumulate(target.begin(), target.end(), int64_t{0});
    // The builder normalises the weights and BlendedDataset normalises them
    // again; the second pass can move the last bit, so it is kept.
    blending_weights_ = megatronNormalize(normalized);
    buildBlendingIndices(blending_weights_, size, &dataset_index_, &dataset_sample_index_);
  } else {
    std::vector<int64_t> lengths;
    for (const auto& dataset : datasets) {
      datasets_.push_back(GptSamples::forSplit(dataset, options.split, split, std::nullopt, options.samples));
      lengths.push_back(datasets_.back().size());
      // BlendedDataset asserts every weight (here: length) > 0.
      PTRAIN_CHECK_AS(ConfigError, lengths.back() > 0, dataset->pathPrefix(), ": its ", name,
                      " split holds no sample of ", options.samples.sequence_length,
                      " tokens, so it cannot weigh in a blend by length; give it more data or leave it out");
    }
    if (num_samples) {
      const int64_t sum = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
      blending_weights_ = megatronNormalize(std::vector<double>(lengths.begin(), lengths.end()));
      buildBlendingIndices(blending_weights_, std::min(*num_samples, sum), &dataset_index_, &dataset_sample_index_);
    } else {
      buildExhaustiveBlendingIndices(lengths, &dataset_index_, &dataset_sample_index_);
    }
  }

  // BlendedDataset's IndexError: a data set asked for more than it holds.
  std::vector<int64_t> used(datasets_.size(), 0);
  for (int16_t k : dataset_index_) ++used[static_cast<size_t>(k)];
  for (size_t k = 0; k < datasets_.size(); ++k) {
    PTRAIN_CHECK_AS(ConfigError, used[k] <= datasets_[k].size(), datasets_[k].dataset().pathPrefix(), ": the ", name,
                    " blend takes ", used[k], " samples from it but it holds ", datasets_[k].size(),
                    "; raise mid_level_dataset_surplus (now ", text::formatNumber(options.mid_level_dataset_surplus),
                    "), e.g. two- or ten-fold");
  }
}

std::vector<int64_t> BlendedGptSamples::sample(int64_t i) const {
  if (i < 0 || i >= size()) {
    throw std::out_of_range("blended sample " + std::to_string(i) + " of " + std::to_string(size()));
  }
  return datasets_[static_cast<size_t>(dataset_index_[static_cast<size_t>(i)])].sample(
      dataset_sample_index_[static_cast<size_t>(i)]);
}

}  // namespace ptrain::datasets

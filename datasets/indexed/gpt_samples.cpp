// megatron-core's GPTDataset indices (gpt_dataset.py, helpers.cpp
// build_sample_idx) and the numbers they are made from (the split string,
// numpy's sum), transcribed step for step: any change of order or rounding
// would give other samples than megatron's.
#include "ptrain/datasets/indexed_dataset.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "ptrain/core/error.h"

namespace ptrain::datasets {
namespace {

// numpy's pairwise_sum for float64 (numpy/_core/src/umath/loops_utils.h.src).
double pairwiseSum(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwiseSum(a, n2) + pairwiseSum(a + n2, n - n2);
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// megatron keeps document ids in int32 arrays (numpy.arange(..., dtype=int32)).
constexpr int64_t kMaxSequences = std::numeric_limits<int32_t>::max();

template <typename T>
void buildSampleIndex(const IndexedDataset& dataset, const std::vector<int32_t>& document_index, int64_t seq_length,
                      int64_t num_samples, int64_t extra, std::vector<T>& sample_index) {
  // helpers.cpp build_sample_idx, line for line.
  sample_index.assign(static_cast<size_t>(2 * (num_samples + 1)), 0);
  int64_t row = 0;
  int64_t position = 0;    // into document_index
  int64_t doc_offset = 0;  // token offset in that document
  sample_index[0] = static_cast<T>(position);
  sample_index[1] = static_cast<T>(doc_offset);
  ++row;
  const auto last = static_cast<int64_t>(document_index.size()) - 1;
  while (row <= num_samples) {
    int64_t remaining = seq_length + extra;
    while (remaining != 0) {
      const int64_t document_length = dataset.sequenceLength(document_index[static_cast<size_t>(position)]) - doc_offset;
      remaining -= document_length;
      if (remaining <= 0) {
        // The sample ends inside this document; the next one starts `extra`
        // tokens before that end, so consecutive samples share a token.
        doc_offset += remaining + document_length - extra;
        remaining = 0;
      } else {
        if (position == last) {
          doc_offset = dataset.sequenceLength(document_index[static_cast<size_t>(position)]) - extra;
          break;
        }
        ++position;
        doc_offset = 0;
      }
    }
    sample_index[static_cast<size_t>(2 * row)] = static_cast<T>(position);
    sample_index[static_cast<size_t>(2 * row + 1)] = static_cast<T>(doc_offset);
    ++row;
  }
}

// _build_document_index: the split's sequences, `epochs` times, shuffled as
// one array, or (separate final epoch) the first epochs and the last apart.
std::vector<int32_t> buildDocumentIndex(int64_t begin, int64_t end, int64_t epochs, NumpyRandomState& random,
                                        bool separate_final_epoch) {
  if (!separate_final_epoch || epochs == 1) {
    const int64_t count = end - begin;
    std::vector<int32_t> index(static_cast<size_t>(epochs * count));
    for (int64_t e = 0; e < epochs; ++e) {
      std::iota(index.begin() + e * count, index.begin() + (e + 1) * count, static_cast<int32_t>(begin));
    }
    random.shuffle(index.data(), static_cast<int64_t>(index.size()));
    return index;
  }
  std::vector<int32_t> first = buildDocumentIndex(begin, end, epochs - 1, random, false);
  const std::vector<int32_t> final_epoch = buildDocumentIndex(begin, end, 1, random, false);
  first.insert(first.end(), final_epoch.begin(), final_epoch.end());
  return first;
}

// _build_shuffle_index: [0, num_samples) shuffled, then [num_samples, total).
template <typename T>
void buildShuffleIndex(int64_t num_samples, int64_t total, NumpyRandomState& random, std::vector<T>& index) {
  index.resize(static_cast<size_t>(total));
  std::iota(index.begin(), index.end(), T{0});
  random.shuffle(index.data(), num_samples);
  if (num_samples == total) return;
  random.shuffle(index.data() + num_samples, total - num_samples);
}

}  // namespace

double numpySum(const double* values, int64_t n) {
  // numpy's add.reduce starts from the identity 0.0 and adds the pairwise
  // sum of the whole array to it.
  return 0.0 + pairwiseSum(values, n);
}

std::vector<double> megatronNormalize(const std::vector<double>& weights) {
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] < 0) {
      throw ConfigError("weight " + std::to_string(i) + " is " + std::to_string(weights[i]) +
                        "; weights must be finite and >= 0");
    }
  }
  const double sum = numpySum(weights.data(), static_cast<int64_t>(weights.size()));
  if (!(sum > 0)) throw ConfigError("the weights sum to 0; give at least one a positive weight");
  std::vector<double> normalized(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) normalized[i] = weights[i] / sum;
  return normalized;
}

const char* megatronSplitName(MegatronSplit split) {
  switch (split) {
    case MegatronSplit::kTrain: return "train";
    case MegatronSplit::kValidation: return "valid";
    case MegatronSplit::kTest: return "test";
  }
  return "unknown";
}

std::array<std::optional<std::pair<double, double>>, 3> megatronSplitMatrix(const std::string& split) {
  // parse_and_normalize_split: re.findall(r"[.0-9]+", split), each a float.
  const std::string fix = "write it as megatron's --split, up to three weights for train, valid and test, e.g. \"969,30,1\"";
  if (split.find('-') != std::string::npos) {
    throw ConfigError("split " + quoted(split) + " has a minus sign; its weights must be >= 0: " + fix);
  }
  std::vector<double> vector;
  for (size_t i = 0; i < split.size();) {
    if (!(std::isdigit(static_cast<unsigned char>(split[i])) || split[i] == '.')) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < split.size() && (std::isdigit(static_cast<unsigned char>(split[j])) || split[j] == '.')) ++j;
    const std::string token = split.substr(i, j - i);
    char* end = nullptr;
    const double value = std::strtod(token.c_str(), &end);
    if (end != token.c_str() + token.size()) {
      throw ConfigError("split " + quoted(split) + ": " + quoted(token) + " is not a number: " + fix);
    }
    vector.push_back(value);
    i = j;
  }
  if (vector.empty() || vector.size() > 3) {
    throw ConfigError("split " + quoted(split) + " has " + std::to_string(vector.size()) + " weights: " + fix);
  }
  vector.resize(3, 0.0);
  const double sum = numpySum(vector.data(), 3);
  if (!(sum > 0) || !std::isfinite(sum)) {
    throw ConfigError("split " + quoted(split) + " weights sum to " + std::to_string(sum) + ": " + fix);
  }
  for (double& v : vector) v /= sum;
  // convert_split_vector_to_split_matrix with one vector: cumulative sums in
  // Python floats, each split's bookends, None where a split is empty.
  const double expansion[4] = {0.0, vector[0], vector[0] + vector[1], (vector[0] + vector[1]) + vector[2]};
  std::array<std::optional<std::pair<double, double>>, 3> matrix;
  for (int i = 0; i < 3; ++i) {
    if (expansion[i + 1] <= expansion[i]) continue;
    matrix[static_cast<size_t>(i)] = std::make_pair(expansion[i], expansion[i + 1]);
  }
  return matrix;
}

std::optional<std::pair<int64_t, int64_t>> megatronSplitRange(const std::string& split, MegatronSplit which,
                                                              int64_t count) {
  const auto matrix = megatronSplitMatrix(split);
  const auto& bookends = matrix[static_cast<size_t>(which)];
  if (!bookends) return std::nullopt;
  // int(round(x * float(count))): Python rounds half to even, as nearbyint
  // does in the default rounding mode.
  const auto begin = static_cast<int64_t>(std::nearbyint(bookends->first * static_cast<double>(count)));
  const auto end = static_cast<int64_t>(std::nearbyint(bookends->second * static_cast<double>(count)));
  return std::make_pair(begin, end);
}

int64_t gptEpochsFor(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, const GptSampleOptions& options) {
  if (!num_samples) return 1;
  PTRAIN_CHECK_AS(ConfigError, tokens_per_epoch > 0, "a GPT split without tokens cannot give ", *num_samples,
                  " samples; give the split data");
  PTRAIN_CHECK_AS(ConfigError, *num_samples >= 0, "cannot ask for ", *num_samples, " samples");
  PTRAIN_CHECK_AS(ConfigError, options.sequence_length > 0 &&
                                   *num_samples <= (std::numeric_limits<int64_t>::max() - 1) / options.sequence_length,
                  "asking for ", *num_samples, " samples of ", options.sequence_length, " tokens overflows int64");
  const int64_t requested = *num_samples * options.sequence_length + (options.add_extra_token_to_sequence ? 1 : 0);
  // The smallest epochs >= 1 with epochs * tokens_per_epoch >= requested, as
  // _get_num_epochs' loop finds it.
  return std::max<int64_t>(1, (requested + tokens_per_epoch - 1) / tokens_per_epoch);
}

int64_t gptSampleCount(int64_t tokens_per_epoch, int64_t epochs, const GptSampleOptions& options) {
  const int64_t extra = options.add_extra_token_to_sequence ? 1 : 0;
  const int64_t tokens = epochs * tokens_per_epoch - extra;
  if (options.drop_last_partial_sequence) return tokens / options.sequence_length;
  // helpers.cpp: ceil(float(...) / seq_length), in single precision.
  const float quotient = static_cast<float>(tokens) / static_cast<float>(options.sequence_length);
  return static_cast<int64_t>(std::ceil(quotient));
}

GptSamples::GptSamples(std::shared_ptr<const IndexedDataset> dataset, int64_t begin, int64_t end,
                       std::optional<int64_t> num_samples, const GptSampleOptions& options)
    : dataset_(std::move(dataset)), options_(options), begin_(begin), end_(end), requested_(num_samples) {
  PTRAIN_CHECK_AS(ConfigError, dataset_ != nullptr, "GptSamples needs a data set");
  const std::string& prefix = dataset_->pathPrefix();
  const int64_t seq = options.sequence_length;
  PTRAIN_CHECK_AS(ConfigError, seq > 1 && seq < std::numeric_limits<int32_t>::max(), prefix,
                  ": sequence_length ", seq, " is out of range; megatron needs 2 <= sequence_length < 2^31 - 1");
  PTRAIN_CHECK_AS(ConfigError, dataset_->sequenceCount() <= kMaxSequences, prefix, ": ", dataset_->sequenceCount(),
                  " sequences, more than megatron's int32 document index holds (2^31 - 1); split the data set into "
                  "several files and blend them");
  PTRAIN_CHECK_AS(ConfigError, 0 <= begin && begin <= end && end <= dataset_->sequenceCount(), prefix,
                  ": sequences [", begin, ", ", end, ") are outside the data set's ", dataset_->sequenceCount());
  PTRAIN_CHECK_AS(ConfigError, !num_samples || *num_samples >= 0, prefix, ": cannot ask for ", *num_samples,
                  " samples");
  for (int64_t i = begin; i < end; ++i) tokens_per_epoch_ += dataset_->sequenceLength(i);
  // build_sample_idx asserts tokens_per_epoch > 1, and with no tokens
  // _get_num_epochs would never end.
  PTRAIN_CHECK_AS(ConfigError, tokens_per_epoch_ > 1, prefix, ": sequences [", begin, ", ", end, ") hold ",
                  tokens_per_epoch_, " tokens; a GPT split needs at least 2: give the split more data (another --split "
                  "or a larger data set)");
  const int64_t extra = options.add_extra_token_to_sequence ? 1 : 0;
  epochs_ = gptEpochsFor(tokens_per_epoch_, num_samples, options);

  int64_t num_samples_sans_final_epoch = 0;
  if (epochs_ > 1) {
    num_samples_sans_final_epoch = ((epochs_ - 1) * tokens_per_epoch_ - extra) / seq;
    const int64_t num_samples_from_final_epoch = *num_samples - num_samples_sans_final_epoch;
    const int64_t num_samples_per_epoch = (tokens_per_epoch_ - extra) / seq;
    PTRAIN_CHECK(num_samples_from_final_epoch >= 0 && num_samples_from_final_epoch <= num_samples_per_epoch + 1,
                 "final epoch holds ", num_samples_from_final_epoch, " samples of ", num_samples_per_epoch);
    // Python's int(0.80 * n) truncates the product.
    separate_final_epoch_ =
        num_samples_from_final_epoch < static_cast<int64_t>(0.80 * static_cast<double>(num_samples_per_epoch));
  }

  // One random stream for both shuffles, in megatron's order.
  NumpyRandomState random(options.seed);
  document_index_ = buildDocumentIndex(begin, end, epochs_, random, separate_final_epoch_);

  const int64_t count = gptSampleCount(tokens_per_epoch_, epochs_, options);
  // megatron keeps the sample index in int32 unless the document index or a
  // sequence length passes int32's range (lengths never do: they are int32).
  if (static_cast<int64_t>(document_index_.size()) <= std::numeric_limits<int32_t>::max()) {
    buildSampleIndex(*dataset_, document_index_, seq, count, extra, sample_index_.narrow());
  } else {
    buildSampleIndex(*dataset_, document_index_, seq, count, extra, sample_index_.widen());
  }
  for (int64_t row = 0; row <= count; ++row) {
    // Only a kept partial sample ending in an empty sequence gets here;
    // megatron's helpers.py asserts on it too.
    PTRAIN_CHECK_AS(ConfigError, sampleIndex(row).second >= 0, prefix,
                    ": the last sequence in the shuffled order is empty, so the kept partial last sample starts at "
                    "offset -1 (megatron fails on this too); remove empty sequences or drop the last partial sample");
  }

  const int64_t total = count;
  const int64_t first = separate_final_epoch_ ? num_samples_sans_final_epoch : total;
  if (total >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) - 1) {
    buildShuffleIndex(first, total, random, shuffle_index_.widen());
  } else {
    buildShuffleIndex(first, total, random, shuffle_index_.narrow());
  }
}

GptSamples GptSamples::forSplit(std::shared_ptr<const IndexedDataset> dataset, const std::string& split,
                                MegatronSplit which, std::optional<int64_t> num_samples,
                                const GptSampleOptions& options) {
  PTRAIN_CHECK_AS(ConfigError, dataset != nullptr, "GptSamples needs a data set");
  const auto range = megatronSplitRange(split, which, dataset->sequenceCount());
  PTRAIN_CHECK_AS(ConfigError, range.has_value(), dataset->pathPrefix(), ": the ", megatronSplitName(which),
                  " split is empty in split ", quoted(split), "; give it a weight or do not ask for it");
  return GptSamples(std::move(dataset), range->first, range->second, num_samples, options);
}

std::vector<GptSamplePart> GptSamples::parts(int64_t i) const {
  if (i < 0 || i >= size()) {
    throw std::out_of_range(dataset_->pathPrefix() + ": sample " + std::to_string(i) + " of " + std::to_string(size()));
  }
  const int64_t extra = options_.add_extra_token_to_sequence ? 1 : 0;
  const int64_t row = shuffle_index_[i];
  const auto [first, first_offset] = sampleIndex(row);
  const auto [last, last_offset] = sampleIndex(row + 1);
  std::vector<GptSamplePart> pieces;
  if (first == last) {
    pieces.push_back({document_index_[static_cast<size_t>(first)], first_offset, last_offset - first_offset + extra});
    return pieces;
  }
  for (int64_t k = first; k <= last; ++k) {
    const int64_t sequence = document_index_[static_cast<size_t>(k)];
    const int64_t offset = k > first ? 0 : first_offset;
    const int64_t length = k < last ? dataset_->sequenceLength(sequence) - offset : last_offset + extra;
    pieces.push_back({sequence, offset, length});
  }
  return pieces;
}

void GptSamples::sample(int64_t i, int64_t* out) const {
  const int64_t want = options_.sequence_length + (options_.add_extra_token_to_sequence ? 1 : 0);
  int64_t filled = 0;
  for (const GptSamplePart& part : parts(i)) {
    PTRAIN_CHECK(filled + part.length <= want, "sample ", i, " has more than ", want, " tokens");
    dataset_->read(part.sequence, part.offset, part.length, out + filled);
    filled += part.length;
  }
  std::fill(out + filled, out + want, options_.pad_token_id);
}

std::vector<int64_t> GptSamples::sample(int64_t i) const {
  std::vector<int64_t> tokens(static_cast<size_t>(options_.sequence_length + (options_.add_extra_token_to_sequence ? 1 : 0)));
  sample(i, tokens.data());
  return tokens;
}

}  // namespace ptrain::datasets

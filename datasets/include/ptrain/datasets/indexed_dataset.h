// Megatron's indexed data set (.idx + .bin), read natively, and the GPT
// samples megatron-core builds from it, index for index.
//
// The files: megatron-core's IndexedDatasetBuilder (megatron/core/datasets/
// indexed_dataset.py, what tools/preprocess_data.py writes) leaves a pair
// PREFIX.bin, the token ids of every sequence back to back in one dtype, and
// PREFIX.idx, little-endian:
//   bytes 0-8    magic "MMIDIDX\0\0"
//   bytes 9-16   version, u64 = 1
//   byte 17      dtype code, u8 (IndexedDType)
//   bytes 18-25  sequence count S, u64
//   bytes 26-33  document index count D, u64 (documents + 1)
//   then         sequence lengths int32[S], sequence pointers int64[S] (byte
//                offsets into the .bin), document indices int64[D] (the first
//                sequence of each document, then S), and for a multimodal set
//                sequence modes int8[S] (no flag marks them: only the size).
// IndexedDataset maps both files read-only and checks the index against both
// sizes; tokens are copied out of the .bin only when asked for, so a rank
// touches only the byte ranges of the sequences its samples cover.
//
// The samples (megatron/core/datasets/gpt_dataset.py GPTDataset and helpers.cpp
// build_sample_idx, blended_dataset.py BlendedDataset and build_blending_indices,
// blended_megatron_dataset_builder.py for the split and the per-dataset sizes):
// a split is a range of sequences (megatron splits a GPT set by sequence, which
// is by document for sets written one sequence per document, preprocess_data's
// default); its sequences are repeated for as many epochs as the requested
// samples need, shuffled with numpy's legacy RandomState(seed), cut into
// samples of sequence_length + 1 tokens that overlap by one token and run
// across sequence boundaries, and the samples shuffled again. Every step,
// every rounding and every random draw is megatron-core 0.16's, so the same
// files, seed and sizes give the very samples megatron would train on
// (tests/unit/test_indexed_dataset.cpp compares them with megatron-core itself).
//
// Thread-safety: after construction every const method may be called from
// several threads at once (IndexedDataset's read observer then runs on the
// reading threads).
//
// Linked statically into the trainers that use it (ptrain_datasets).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace ptrain::datasets {

// ---------------------------------------------------------------------------
// The files

// megatron-core's DType codes, as byte 17 of the .idx stores them.
enum class IndexedDType : uint8_t {
  kUint8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUint16 = 8,
};

// numpy's name of the dtype: "uint16", "int32", ...
const char* indexedDTypeName(IndexedDType dtype);
// Bytes per token: 1, 2, 4 or 8.
int64_t indexedDTypeSize(IndexedDType dtype);

inline constexpr char kIndexedMagic[] = "MMIDIDX\0\0";  // 9 bytes, without the literal's own NUL
inline constexpr int64_t kIndexedMagicBytes = 9;
inline constexpr int64_t kIndexedHeaderBytes = 34;  // magic, version, dtype, the two counts
inline constexpr uint64_t kIndexedVersion = 1;

// One copy of tokens out of the .bin: bytes [begin, end) of sequence `sequence`.
struct IndexedBinRead {
  int64_t sequence = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

// Told of every copy out of the .bin, on the thread that reads.
using IndexedReadObserver = std::function<void(const IndexedBinRead&)>;

// A megatron .idx/.bin pair, memory-mapped read-only. Non-copyable, not
// movable: share it through std::shared_ptr<const IndexedDataset>.
class IndexedDataset {
 public:
  // Opens PATH_PREFIX.idx and PATH_PREFIX.bin (megatron's --data-path names
  // the prefix) and checks the index without reading the .bin's contents:
  // magic, version, dtype, the counts against the .idx size, every length >= 0,
  // every sequence inside the .bin and after the previous one, the .bin's size
  // equal to the end of the last sequence, the document indices rising from 0
  // to the sequence count. Throws ConfigError, one line "FILE: byte N: what;
  // how to fix", on the first violation or a file that cannot be opened.
  explicit IndexedDataset(const std::string& path_prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& pathPrefix() const { return prefix_; }
  std::string idxPath() const { return prefix_ + ".idx"; }
  std::string binPath() const { return prefix_ + ".bin"; }
  IndexedDType dtype() const { return dtype_; }
  int64_t itemSize() const { return item_size_; }
  int64_t binBytes() const { return bin_bytes_; }

  // S, the number of sequences (megatron's len(IndexedDataset); GPT's "documents").
  int64_t sequenceCount() const { return sequence_count_; }
  // D - 1, the number of documents (a document is one or more consecutive sequences).
  int64_t documentCount() const { return document_index_count_ - 1; }
  // Sequence i's length in tokens, i in [0, S); throws std::out_of_range.
  int64_t sequenceLength(int64_t i) const;
  // Sequence i's first byte in the .bin, i in [0, S); throws std::out_of_range.
  int64_t sequencePointer(int64_t i) const;
  // The first sequence of document d, d in [0, documentCount()]; d =
  // documentCount() gives S. Throws std::out_of_range.
  int64_t documentIndex(int64_t d) const;
  // Whether the .idx carries megatron's multimodal sequence modes block.
  bool hasSequenceModes() const { return has_modes_; }
  // Sequence i's mode (multimodal sets only); throws std::out_of_range.
  int8_t sequenceMode(int64_t i) const;

  // Tokens [offset, offset + length) of sequence i as int64 into out[0,
  // length), converted from the stored dtype; 0 <= offset, offset + length <=
  // sequenceLength(i), else std::out_of_range. A float token that is not a
  // whole number throws ConfigError naming its byte. Touches only those bytes
  // of the .bin, counts them in bytesRead() and tells the observer.
  void read(int64_t i, int64_t offset, int64_t length, int64_t* out) const;
  // The same into a new vector; length < 0 reads to the end of the sequence.
  std::vector<int64_t> read(int64_t i, int64_t offset = 0, int64_t length = -1) const;

  // Bytes of the .bin copied out by read() so far, over every thread.
  uint64_t bytesRead() const { return bytes_read_.load(std::memory_order_relaxed); }
  // Sets (or, with an empty function, clears) the observer every read()
  // reports to. Not thread-safe: call it while no other thread reads.
  void setReadObserver(IndexedReadObserver observer) { observer_ = std::move(observer); }

 private:
  int32_t lengthAt(int64_t i) const;
  int64_t pointerAt(int64_t i) const;
  int64_t documentAt(int64_t d) const;
  // Reads the header into the members below and checks the whole index.
  void validate();

  std::string prefix_;
  IndexedDType dtype_ = IndexedDType::kInt32;
  int64_t item_size_ = 4;
  int64_t sequence_count_ = 0;
  int64_t document_index_count_ = 0;
  bool has_modes_ = false;
  const unsigned char* idx_ = nullptr;  // the mapped .idx
  int64_t idx_bytes_ = 0;
  const unsigned char* bin_ = nullptr;  // the mapped .bin (nullptr when empty)
  int64_t bin_bytes_ = 0;
  int64_t lengths_at_ = 0;    // byte offsets of the .idx arrays
  int64_t pointers_at_ = 0;
  int64_t documents_at_ = 0;
  int64_t modes_at_ = 0;
  mutable std::atomic<uint64_t> bytes_read_{0};
  IndexedReadObserver observer_;
};

// ---------------------------------------------------------------------------
// numpy, where megatron's numbers go through it

// numpy.random.RandomState(seed) for an int seed, as far as megatron uses it:
// the MT19937 stream (numpy's legacy seeding is init_genrand, which is what
// the C++ standard specifies for std::mt19937(seed), so every platform gives
// the same stream) and shuffle() of a 1-D array. Not thread-safe.
class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  // numpy's random_interval: uniform in [0, max] by masked rejection; 32-bit
  // draws while max fits in 32 bits, else 64-bit draws (high word first).
  uint64_t interval(uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    uint64_t value;
    if (max <= 0xffffffffULL) {
      while ((value = (static_cast<uint64_t>(mt_()) & mask)) > max) {
      }
    } else {
      for (;;) {
        const uint64_t high = mt_();
        value = ((high << 32) | static_cast<uint64_t>(mt_())) & mask;
        if (value <= max) break;
      }
    }
    return value;
  }

  // RandomState.shuffle of a 1-D array of n items: Fisher-Yates from the end.
  template <typename T>
  void shuffle(T* data, int64_t n) {
    for (int64_t i = n - 1; i >= 1; --i) {
      const auto j = static_cast<int64_t>(interval(static_cast<uint64_t>(i)));
      std::swap(data[i], data[j]);
    }
  }

 private:
  std::mt19937 mt_;
};

// numpy.sum of a float64 array: numpy's pairwise summation (blocks of 128,
// eight accumulators), which is not a plain left-to-right sum past 7 items.
double numpySum(const double* values, int64_t n);

// megatron.core.datasets.utils.normalize: each weight over numpy.sum of them.
// Throws ConfigError when a weight is negative or not finite or all are 0.
std::vector<double> megatronNormalize(const std::vector<double>& weights);

// ---------------------------------------------------------------------------
// The split

enum class MegatronSplit { kTrain = 0, kValidation = 1, kTest = 2 };

// megatron's Split names: "train", "valid", "test".
const char* megatronSplitName(MegatronSplit split);

// megatron's split matrix for a split string such as "969,30,1"
// (parse_and_normalize_split, then convert_split_vector_to_split_matrix): per
// split its [begin, end) as fractions, or nullopt for an empty split. Missing
// weights are 0. Throws ConfigError for a string without 1 to 3 non-negative
// numbers of positive sum.
std::array<std::optional<std::pair<double, double>>, 3> megatronSplitMatrix(const std::string& split);

// The elements [begin, end) of `which` among `count` (the builder's
// int(round(fraction * count)), round half to even), or nullopt when the
// split is empty in the matrix (megatron builds no data set for it).
std::optional<std::pair<int64_t, int64_t>> megatronSplitRange(const std::string& split, MegatronSplit which,
                                                              int64_t count);

// ---------------------------------------------------------------------------
// GPT samples

struct GptSampleOptions {
  int64_t sequence_length = 0;             // > 1 (megatron asserts it); a sample has this + 1 tokens
  uint32_t seed = 1234;                    // megatron's random_seed (--seed)
  bool add_extra_token_to_sequence = true; // megatron's default: seq + 1 tokens, inputs and labels both seq long
  // false keeps a last, shorter sample padded with pad_token_id; megatron
  // sets it false only for the validation split with
  // drop_last_partial_validation_sequence = false.
  bool drop_last_partial_sequence = true;
  int64_t pad_token_id = -1;  // megatron's _PAD_TOKEN_ID unless the tokenizer has its own pad
};

// One piece of a sample: tokens [offset, offset + length) of a sequence.
struct GptSamplePart {
  int64_t sequence = 0;
  int64_t offset = 0;
  int64_t length = 0;
};

namespace detail {
// An index vector kept in the narrow type megatron picks when every value
// fits (Narrow), else int64, so it costs what megatron's .npy costs.
template <typename Narrow>
class PackedIndex {
 public:
  int64_t operator[](int64_t i) const {
    return wide_ ? wide_values_[static_cast<size_t>(i)] : static_cast<int64_t>(narrow_values_[static_cast<size_t>(i)]);
  }
  int64_t size() const {
    return static_cast<int64_t>(wide_ ? wide_values_.size() : narrow_values_.size());
  }
  bool wide() const { return wide_; }
  std::vector<Narrow>& narrow() { return narrow_values_; }
  std::vector<int64_t>& widen() {
    wide_ = true;
    return wide_values_;
  }

 private:
  bool wide_ = false;
  std::vector<Narrow> narrow_values_;
  std::vector<int64_t> wide_values_;
};
}  // namespace detail

// megatron's GPTDataset._get_num_epochs: the epochs that hold `num_samples`
// samples of the options' length (1 when num_samples is nullopt);
// tokens_per_epoch > 0.
int64_t gptEpochsFor(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, const GptSampleOptions& options);

// The samples build_sample_idx cuts from `epochs` epochs of tokens_per_epoch
// tokens (including a last partial one when the options keep it).
int64_t gptSampleCount(int64_t tokens_per_epoch, int64_t epochs, const GptSampleOptions& options);

// megatron's GPTDataset over sequences [begin, end) of one IndexedDataset.
// The document, sample and shuffle indices live in memory (4 bytes per
// sequence per epoch, then 8 and 4 bytes per sample, 16 and 8 past int32's
// range, as megatron's .npy files); tokens are read from the .bin per sample.
class GptSamples {
 public:
  // num_samples: the samples asked for (megatron's num_samples; the data set
  // may hold more, the rest of the last epoch); nullopt builds one epoch.
  // Throws ConfigError for a sequence length <= 1, a range outside the data
  // set, a range of fewer than 2 tokens, or more than 2^31 - 1 sequences
  // (megatron's int32 document index).
  GptSamples(std::shared_ptr<const IndexedDataset> dataset, int64_t begin, int64_t end,
             std::optional<int64_t> num_samples, const GptSampleOptions& options);

  // The split's sequences of a data set, as megatron's builder picks them
  // (megatronSplitRange over its sequence count). Throws ConfigError when
  // that split is empty.
  static GptSamples forSplit(std::shared_ptr<const IndexedDataset> dataset, const std::string& split,
                             MegatronSplit which, std::optional<int64_t> num_samples,
                             const GptSampleOptions& options);

  // len(GPTDataset): the samples in the sample index.
  int64_t size() const { return sample_index_.size() / 2 - 1; }
  // The num_samples it was built for (nullopt: one epoch).
  std::optional<int64_t> requestedSamples() const { return requested_; }
  int64_t epochs() const { return epochs_; }
  bool separateFinalEpoch() const { return separate_final_epoch_; }
  int64_t tokensPerEpoch() const { return tokens_per_epoch_; }
  int64_t beginSequence() const { return begin_; }
  int64_t endSequence() const { return end_; }
  const GptSampleOptions& options() const { return options_; }
  const IndexedDataset& dataset() const { return *dataset_; }

  // Sample i, i in [0, size()): sequence_length + add_extra_token tokens
  // (megatron's _query_document_sample_shuffle_indices text), padded with
  // pad_token_id only for a kept last partial sample. Reads only the bytes of
  // the sequences listed by parts(i). Throws std::out_of_range.
  std::vector<int64_t> sample(int64_t i) const;
  void sample(int64_t i, int64_t* out) const;
  // The sequence pieces sample i is made of, in order (before any padding).
  std::vector<GptSamplePart> parts(int64_t i) const;

  // The indices themselves (megatron's .npy caches), for checks.
  // documentIndex: epochs x sequences, shuffled; sampleIndex(row) = (position
  // in the document index, token offset), rows [0, size()]; shuffleIndex(i)
  // = the row sample i starts at.
  const std::vector<int32_t>& documentIndex() const { return document_index_; }
  std::pair<int64_t, int64_t> sampleIndex(int64_t row) const {
    return {sample_index_[2 * row], sample_index_[2 * row + 1]};
  }
  int64_t shuffleIndex(int64_t i) const { return shuffle_index_[i]; }

 private:
  std::shared_ptr<const IndexedDataset> dataset_;
  GptSampleOptions options_;
  int64_t begin_ = 0;
  int64_t end_ = 0;
  std::optional<int64_t> requested_;
  int64_t tokens_per_epoch_ = 0;
  int64_t epochs_ = 1;
  bool separate_final_epoch_ = false;
  std::vector<int32_t> document_index_;
  detail::PackedIndex<int32_t> sample_index_;    // (size() + 1) x 2, row-major
  detail::PackedIndex<uint32_t> shuffle_index_;  // size()
};

// ---------------------------------------------------------------------------
// Blending

// helpers.cpp build_blending_indices: for each of `size` samples the data set
// whose share lags its weight most (weights as given, normally summing to 1;
// ties go to the lowest index), and that data set's next sample number.
void buildBlendingIndices(const std::vector<double>& weights, int64_t size, std::vector<int16_t>* dataset_index,
                          std::vector<int64_t>* dataset_sample_index);

// helpers.cpp build_exhaustive_blending_indices: exactly sizes[k] samples of
// data set k (every size > 0), interleaved by the same rule.
void buildExhaustiveBlendingIndices(const std::vector<int64_t>& sizes, std::vector<int16_t>* dataset_index,
                                    std::vector<int64_t>* dataset_sample_index);

// The builder's _get_size_per_split_per_dataset for one split: per data set
// int(ceil(ceil(target * weight) * (1 + surplus))), weights normalised.
std::vector<int64_t> megatronBlendSizes(const std::vector<double>& normalized_weights, int64_t target,
                                        double surplus);

struct GptBlendOptions {
  GptSampleOptions samples;
  std::string split = "969,30,1";          // megatron's --split
  double mid_level_dataset_surplus = 0.005; // megatron's default margin per data set
};

// One split of megatron's BlendedMegatronDatasetBuilder over several files
// (config.blend = (prefixes, weights), config.split), as its build() makes it:
//   weights given: each data set asked for int(ceil(ceil(n * w) * 1.005))
//     samples (w the normalised weight), the blend holding sum(ceil(n * w))
//     samples by build_blending_indices over the weights normalised again;
//   weights empty: each data set one epoch, blended by their lengths, the
//     blend min(n, their sum) samples, or every sample exhaustively when n
//     is nullopt;
//   one data set and no weights: that GPTDataset itself (megatron builds no
//     BlendedDataset then).
class BlendedGptSamples {
 public:
  // weights: one per data set, > 0, any scale; or empty. num_samples:
  // megatron's sizes[split]; required with weights. Throws ConfigError for a
  // mismatch, an empty split, or a blend that asks a data set for more
  // samples than it holds (megatron's IndexError: raise the surplus).
  BlendedGptSamples(std::vector<std::shared_ptr<const IndexedDataset>> datasets, const std::vector<double>& weights,
                    MegatronSplit split, std::optional<int64_t> num_samples, const GptBlendOptions& options);

  int64_t size() const { return static_cast<int64_t>(dataset_index_.size()); }
  int64_t datasetCount() const { return static_cast<int64_t>(datasets_.size()); }
  const GptSamples& dataset(int64_t k) const { return datasets_.at(static_cast<size_t>(k)); }
  // The data set sample i comes from, and which of its samples; i in [0, size()).
  int64_t datasetOf(int64_t i) const { return dataset_index_.at(static_cast<size_t>(i)); }
  int64_t datasetSampleOf(int64_t i) const { return dataset_sample_index_.at(static_cast<size_t>(i)); }
  // The weights build_blending_indices was given (empty when exhaustive or a
  // single data set).
  const std::vector<double>& blendingWeights() const { return blending_weights_; }
  // Sample i of the blend (dataset(datasetOf(i)).sample(datasetSampleOf(i))).
  std::vector<int64_t> sample(int64_t i) const;

 private:
  std::vector<GptSamples> datasets_;
  std::vector<double> blending_weights_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

}  // namespace ptrain::datasets

// TokenCorpus: the llm trainer's data from files, Megatron's indexed data
// sets (PREFIX.bin + PREFIX.idx, what megatron's preprocess_data.py and
// `ptrain data prepare` write), sampled exactly as megatron-core's GPTDataset
// and BlendedDataset do (datasets/indexed_dataset.h): documents concatenated
// into seq_length + 1 token samples, shuffled with train.seed, several files
// blended by weight, split into train / validation by data.split.
//
// Sample i of the training order is row i % global_batch of step
// i / global_batch: a pure function of the files, the seed, the split and
// the number of samples the run asks for (train.steps x global_batch_size,
// megatron's train_samples), so every layout and every resume reads the same
// rows, and a rank reads from the .bin only the tokens of its own rows.
//
// Thread-safety: const methods may be called from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptrain/datasets/indexed_dataset.h"
#include "ptrain/engine/batch.h"

namespace ptrain::llm {

struct TokenCorpusOptions {
  // Megatron's --data-path: prefixes, or weight prefix pairs ("0.7 a 0.3 b").
  std::vector<std::string> path;
  std::string split = "969,30,1";
  int64_t seq_length = 0;
  uint32_t seed = 1234;
  int64_t train_samples = 0;       // train.steps x global_batch_size
  int64_t validation_samples = 0;  // data.eval_size; 0: no validation
};

// What `ptrain data prepare` writes beside PREFIX.idx as PREFIX.json
// ({"format": "ptrain.tokens", "vocab_size", "eod", "tokenizer", ...}).
struct CorpusMetadata {
  int64_t vocab_size = 0;  // 0: not known (a data set megatron wrote)
  int64_t eod = -1;
};

class TokenCorpus {
 public:
  // Opens every file (header checks only) and builds the sample orders.
  // Throws ConfigError naming data.path / the file for a malformed path list,
  // a missing or damaged pair, an empty split, or too few tokens.
  explicit TokenCorpus(const TokenCorpusOptions& options);

  const TokenCorpusOptions& options() const { return options_; }
  // The vocabulary the files' metadata give (the largest of them), or 0.
  int64_t metadataVocab() const { return vocab_; }
  int64_t trainSamples() const { return train_->size(); }
  int64_t validationSamples() const { return validation_ ? validation_->size() : 0; }
  // Samples [first, first + count) of the training order, or of the
  // validation split, as tokens / targets [count, seq_length] and loss_mask
  // (1, or 0 on megatron's padding of a partial last sample). Throws
  // ConfigError naming the file when a token id is not below `vocab`.
  Batch trainRows(int64_t first, int64_t count, int64_t vocab) const;
  Batch validationRows(int64_t first, int64_t count, int64_t vocab) const;
  // What a checkpoint records: the files (path, size, mtime), the split,
  // seed, seq_length and samples the order was built for, and `consumed`.
  nlohmann::json position(int64_t consumed) const;
  // Why the order of `saved` is not this one's (nullopt: the same).
  std::optional<std::string> differs(const nlohmann::json& saved) const;
  // Bytes read from the .bin files so far (every data set).
  uint64_t bytesRead() const;

 private:
  Batch rows(const datasets::BlendedGptSamples& samples, int64_t first, int64_t count, int64_t vocab) const;

  TokenCorpusOptions options_;
  std::vector<std::shared_ptr<const datasets::IndexedDataset>> files_;
  std::vector<double> weights_;
  int64_t vocab_ = 0;
  std::unique_ptr<datasets::BlendedGptSamples> train_;
  std::unique_ptr<datasets::BlendedGptSamples> validation_;
};

// PREFIX.json of `prefix`, or defaults when there is none. Throws
// ConfigError naming the file when it is not what `ptrain data prepare` writes.
CorpusMetadata readCorpusMetadata(const std::string& prefix);

}  // namespace ptrain::llm

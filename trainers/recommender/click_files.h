// ClickFiles: the recommender's data from files (data.name: criteo), Criteo
// TSV logs read through datasets::CriteoDataset (plain or gzip, random
// access, ids hashed into the tables, log(1 + count) on the counts, ptrain's
// history columns), in the training order the trainer samples.
//
// Training order. Sample i (= step * global_batch + row) is position
// i % N of epoch i / N of the file's N records, so several epochs wrap
// around. Without shuffling, position p is record p: the file order, which
// is what makes `ptrain data export clicks` give the generator's batches bit
// for bit. With shuffling, the records are cut into blocks of
// shuffle_block consecutive records (the last may be shorter); each epoch
// visits the blocks in an order seeded by (seed, epoch), and the records of
// a block in an order seeded by (seed, epoch, block). Blocks rather than a
// full permutation because a gzip file is read from an access point for
// every run of records: a rank's rows of a step then lie within a block or
// two, a few runs, instead of one run per row. The order is a pure function
// of (N, shuffle, shuffle_block, seed), the same for every layout, rank and
// resume.
//
// Reading. trainRows reads only the records of the rows asked for: they are
// sorted and read in runs of consecutive records (CriteoDataset::readRecords
// per run); for gzip, runs less than one access point span apart are read as
// one, since the text between them is inflated anyway.
//
// Thread-safety: const methods may be called from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptrain/datasets/criteo_dataset.h"
#include "ptrain/engine/batch.h"

namespace ptrain::recommender {

struct ClickFilesOptions {
  std::string train_path;       // data.path
  std::string validation_path;  // data.validation_path; "" for none
  std::vector<int64_t> table_sizes;
  int64_t item_feature = 1;
  int64_t category_feature = 2;
  int64_t interest_feature = 3;
  int64_t history_length = 8;   // H of the batches; a file's history columns must be H (or none)
  bool shuffle = true;          // data.shuffle
  int64_t shuffle_block = 4096; // data.shuffle_block, >= 1
  uint64_t seed = 0;            // train.seed
};

class ClickFiles {
 public:
  // Opens both files, loading or building their indexes (CriteoDataset).
  // Throws ConfigError (one line, naming the file) for a missing or
  // unreadable file, a line with another column count, an empty training
  // file, or history columns other than history_length.
  explicit ClickFiles(ClickFilesOptions options);
  ~ClickFiles();

  const ClickFilesOptions& options() const { return options_; }
  int64_t trainRecords() const;
  int64_t validationRecords() const;  // 0 without a validation file
  const datasets::CriteoDataset& trainFile() const { return *train_; }
  const datasets::CriteoDataset* validationFile() const { return validation_.get(); }

  // The record of training sample `sample` (>= 0), as the order above says.
  int64_t recordOf(int64_t sample) const;
  // Training samples [first, first + count) as the trainer's batch tensors
  // (ClicksDataset::batch's keys but "probabilities", which files lack).
  Batch trainRows(int64_t first, int64_t count) const;
  // Validation records first + r, r < count, each modulo the record count
  // (an evaluation chunk padded past the end wraps; such rows are not scored).
  Batch validationRows(int64_t first, int64_t count) const;

  // What a checkpoint records: the files (path, bytes, mtime), the record
  // count, shuffle, shuffle_block, seed and `consumed` samples.
  nlohmann::json position(int64_t consumed) const;
  // Why continuing after `saved` would not continue its order (nullopt: it would).
  std::optional<std::string> differs(const nlohmann::json& saved) const;

 private:
  // The records of training samples [first, first + count).
  std::vector<int64_t> recordsOf(int64_t first, int64_t count) const;
  Batch read(const datasets::CriteoDataset& file, const std::vector<int64_t>& records) const;
  // The epoch's block order (cached for the last epoch asked).
  std::shared_ptr<const std::vector<int64_t>> blockOrder(int64_t epoch) const;

  ClickFilesOptions options_;
  std::unique_ptr<datasets::CriteoDataset> train_;
  std::unique_ptr<datasets::CriteoDataset> validation_;
  mutable std::mutex mutex_;
  mutable int64_t cachedEpoch_ = -1;
  mutable std::shared_ptr<const std::vector<int64_t>> cachedOrder_;
};

// Where `ptrain data export clicks OUT` writes the validation samples: OUT
// with the last "train" of its file name replaced by "validation"
// (clicks_train.tsv.gz -> clicks_validation.tsv.gz), or, without "train" in
// the name, BASE.validation.EXT (clicks.tsv -> clicks.validation.tsv;
// EXT .tsv, .tsv.gz, .gz or nothing).
std::string validationPathFor(const std::string& trainPath);

}  // namespace ptrain::recommender

// IndexedWriter: writes a Megatron indexed data set (PREFIX.bin + PREFIX.idx,
// the layout megatron-core's IndexedDatasetBuilder writes and
// indexed_dataset.h reads), one document at a time, so a corpus of any size
// streams through. Each document is one sequence (preprocess_data.py's
// default). Both files are written under temporary names and renamed into
// place by finish(), so a reader never sees half a data set.
//
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ptrain/datasets/indexed_dataset.h"

namespace ptrain::datasets {

// megatron's choice of token type: uint16 below 65500 ids, else int32.
IndexedDType indexedDTypeForVocab(int64_t vocab_size);

class IndexedWriter {
 public:
  // Throws ConfigError naming the file when it cannot be created, or for a
  // dtype other than uint16 / int32 / int64.
  IndexedWriter(std::string prefix, IndexedDType dtype);
  ~IndexedWriter();  // an unfinished writer removes its temporary files
  IndexedWriter(const IndexedWriter&) = delete;
  IndexedWriter& operator=(const IndexedWriter&) = delete;

  // Appends one document; every id must fit the dtype (ConfigError otherwise).
  void addDocument(const std::vector<int64_t>& tokens);
  // Writes the .idx and renames both files into place.
  void finish();

  int64_t documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t tokens() const { return tokens_; }

 private:
  std::string prefix_;
  IndexedDType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  int64_t tokens_ = 0;
  bool finished_ = false;
};

}  // namespace ptrain::datasets

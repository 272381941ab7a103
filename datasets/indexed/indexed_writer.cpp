#include "ptrain/datasets/indexed_writer.h"

#include <cstring>
#include <limits>

#include "ptrain/core/error.h"

namespace ptrain::datasets {

namespace {

std::string tmpName(const std::string& path) { return path + ".tmp"; }

void put(std::FILE* f, const void* data, size_t bytes, const std::string& path) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, f) != bytes) {
    throw ConfigError(path + ": cannot write (" + std::strerror(errno) + "); is the disk full?");
  }
}

}  // namespace

IndexedDType indexedDTypeForVocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDType::kUint16 : IndexedDType::kInt32;
}

IndexedWriter::IndexedWriter(std::string prefix, IndexedDType dtype) : prefix_(std::move(prefix)), dtype_(dtype) {
  if (dtype != IndexedDType::kUint16 && dtype != IndexedDType::kInt32 && dtype != IndexedDType::kInt64) {
    throw ConfigError(prefix_ + ": token type " + indexedDTypeName(dtype) + " is not one ptrain writes (uint16, int32, int64)");
  }
  bin_ = std::fopen(tmpName(prefix_ + ".bin").c_str(), "wb");
  if (bin_ == nullptr) throw ConfigError(prefix_ + ".bin: cannot create (" + std::strerror(errno) + ")");
}

IndexedWriter::~IndexedWriter() {
  if (bin_ != nullptr) std::fclose(bin_);
  if (!finished_) {
    std::remove(tmpName(prefix_ + ".bin").c_str());
    std::remove(tmpName(prefix_ + ".idx").c_str());
  }
}

void IndexedWriter::addDocument(const std::vector<int64_t>& tokens) {
  PTRAIN_CHECK(!finished_, "indexed writer: addDocument after finish");
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw ConfigError(prefix_ + ".bin: a document of " + std::to_string(tokens.size()) + " tokens is longer than megatron's int32 lengths allow");
  }
  const std::string path = prefix_ + ".bin";
  const int64_t top = dtype_ == IndexedDType::kUint16 ? 65535 : dtype_ == IndexedDType::kInt32 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max();
  for (int64_t id : tokens) {
    if (id < 0 || id > top) {
      throw ConfigError(path + ": token id " + std::to_string(id) + " does not fit " + indexedDTypeName(dtype_));
    }
  }
  if (dtype_ == IndexedDType::kUint16) {
    std::vector<uint16_t> v(tokens.begin(), tokens.end());
    put(bin_, v.data(), v.size() * 2, path);
  } else if (dtype_ == IndexedDType::kInt32) {
    std::vector<int32_t> v(tokens.begin(), tokens.end());
    put(bin_, v.data(), v.size() * 4, path);
  } else {
    put(bin_, tokens.data(), tokens.size() * 8, path);
  }
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  tokens_ += static_cast<int64_t>(tokens.size());
}

void IndexedWriter::finish() {
  PTRAIN_CHECK(!finished_, "indexed writer: finish twice");
  const std::string binPath = prefix_ + ".bin", idxPath = prefix_ + ".idx";
  if (std::fflush(bin_) != 0 || std::fclose(bin_) != 0) {
    bin_ = nullptr;
    throw ConfigError(binPath + ": cannot write (" + std::strerror(errno) + ")");
  }
  bin_ = nullptr;
  std::FILE* idx = std::fopen(tmpName(idxPath).c_str(), "wb");
  if (idx == nullptr) throw ConfigError(idxPath + ": cannot create (" + std::strerror(errno) + ")");
  try {
    const uint64_t version = kIndexedVersion;
    const uint8_t code = static_cast<uint8_t>(dtype_);
    const uint64_t sequences = lengths_.size(), documentEntries = lengths_.size() + 1;
    put(idx, kIndexedMagic, kIndexedMagicBytes, idxPath);
    put(idx, &version, 8, idxPath);
    put(idx, &code, 1, idxPath);
    put(idx, &sequences, 8, idxPath);
    put(idx, &documentEntries, 8, idxPath);
    put(idx, lengths_.data(), lengths_.size() * 4, idxPath);
    std::vector<int64_t> pointers(lengths_.size());
    int64_t at = 0;
    for (size_t i = 0; i < lengths_.size(); ++i) {
      pointers[i] = at;
      at += static_cast<int64_t>(lengths_[i]) * indexedDTypeSize(dtype_);
    }
    put(idx, pointers.data(), pointers.size() * 8, idxPath);
    std::vector<int64_t> documents(documentEntries);
    for (size_t i = 0; i < documents.size(); ++i) documents[i] = static_cast<int64_t>(i);
    put(idx, documents.data(), documents.size() * 8, idxPath);
  } catch (...) {
    std::fclose(idx);
    throw;
  }
  if (std::fclose(idx) != 0) throw ConfigError(idxPath + ": cannot write (" + std::strerror(errno) + ")");
  if (std::rename(tmpName(binPath).c_str(), binPath.c_str()) != 0 ||
      std::rename(tmpName(idxPath).c_str(), idxPath.c_str()) != 0) {
    throw ConfigError(prefix_ + ": cannot rename the data set into place (" + std::strerror(errno) + ")");
  }
  finished_ = true;
}

}  // namespace ptrain::datasets

#include "ptrain/datasets/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "ptrain/core/error.h"
#include "ptrain/core/text.h"

namespace ptrain::datasets {
namespace {

// Every refusal ends with how to get a good pair: the index and the data are
// written together, so the cure for either is to write both again.
constexpr const char* kRebuild =
    "rebuild the .idx/.bin pair with megatron's tools/preprocess_data.py (or ptrain data prepare)";

[[noreturn]] void refuse(const std::string& file, int64_t byte, const std::string& what, const std::string& fix) {
  throw ConfigError(file + ": byte " + std::to_string(byte) + ": " + what + "; " + fix);
}

// The .idx arrays start at byte 34, so none is aligned for its type: loads go
// through memcpy, which compiles to a plain (unaligned-safe) move on x86 and ARM.
template <typename T>
T load(const unsigned char* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

struct Mapping {
  const unsigned char* data = nullptr;
  int64_t bytes = 0;
};

Mapping mapReadOnly(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    throw ConfigError(path + ": cannot open: " + std::strerror(error) +
                      "; give the data set's path prefix (PREFIX for PREFIX.idx and PREFIX.bin), as megatron's "
                      "--data-path does");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    throw ConfigError(path + ": cannot stat: " + std::strerror(error));
  }
  Mapping mapping;
  mapping.bytes = static_cast<int64_t>(st.st_size);
  // mmap refuses a length of 0; an empty file needs no mapping.
  if (mapping.bytes > 0) {
    void* data = ::mmap(nullptr, static_cast<size_t>(mapping.bytes), PROT_READ, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      throw ConfigError(path + ": cannot map " + std::to_string(mapping.bytes) + " bytes: " + std::strerror(error));
    }
    mapping.data = static_cast<const unsigned char*>(data);
  }
  // The mapping keeps the file open on its own.
  ::close(fd);
  return mapping;
}

void unmap(const unsigned char* data, int64_t bytes) {
  if (data != nullptr) ::munmap(const_cast<unsigned char*>(data), static_cast<size_t>(bytes));
}

bool knownDType(uint8_t code) { return code >= 1 && code <= 8; }

std::string printable(const unsigned char* bytes, int64_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string text;
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char c = bytes[i];
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      text += static_cast<char>(c);
    } else {
      text += "\\x";
      text += kHex[c >> 4];
      text += kHex[c & 15];
    }
  }
  return text;
}

}  // namespace

const char* indexedDTypeName(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::kUint8: return "uint8";
    case IndexedDType::kInt8: return "int8";
    case IndexedDType::kInt16: return "int16";
    case IndexedDType::kInt32: return "int32";
    case IndexedDType::kInt64: return "int64";
    case IndexedDType::kFloat64: return "float64";
    case IndexedDType::kFloat32: return "float32";
    case IndexedDType::kUint16: return "uint16";
  }
  return "unknown";
}

int64_t indexedDTypeSize(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::kUint8:
    case IndexedDType::kInt8: return 1;
    case IndexedDType::kInt16:
    case IndexedDType::kUint16: return 2;
    case IndexedDType::kInt32:
    case IndexedDType::kFloat32: return 4;
    case IndexedDType::kInt64:
    case IndexedDType::kFloat64: return 8;
  }
  return 0;
}

IndexedDataset::IndexedDataset(const std::string& path_prefix) : prefix_(path_prefix) {
  const std::string idx = idxPath();
  const Mapping index = mapReadOnly(idx);
  idx_ = index.data;
  idx_bytes_ = index.bytes;
  try {
    const Mapping data = mapReadOnly(binPath());
    bin_ = data.data;
    bin_bytes_ = data.bytes;
    validate();
  } catch (...) {
    unmap(idx_, idx_bytes_);
    unmap(bin_, bin_bytes_);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  unmap(idx_, idx_bytes_);
  unmap(bin_, bin_bytes_);
}

void IndexedDataset::validate() {
  const std::string idx = idxPath();
  const std::string bin = binPath();

  if (idx_bytes_ < kIndexedMagicBytes ||
      std::memcmp(idx_, kIndexedMagic, static_cast<size_t>(kIndexedMagicBytes)) != 0) {
    const int64_t shown = std::min<int64_t>(idx_bytes_, kIndexedMagicBytes);
    refuse(idx, 0,
           "starts with \"" + printable(idx_, shown) + "\", not megatron's index magic \"MMIDIDX\\x00\\x00\"" +
               (idx_bytes_ < kIndexedMagicBytes ? " (the file is only " + std::to_string(idx_bytes_) + " bytes)" : ""),
           "this is not a megatron indexed data set index (the legacy lazy/cached formats are not read); " +
               std::string(kRebuild));
  }
  if (idx_bytes_ < kIndexedHeaderBytes) {
    refuse(idx, idx_bytes_,
           "the file ends inside the " + std::to_string(kIndexedHeaderBytes) + "-byte header (it is " +
               std::to_string(idx_bytes_) + " bytes)",
           "the file is truncated; " + std::string(kRebuild));
  }
  const uint64_t version = load<uint64_t>(idx_ + 9);
  if (version != kIndexedVersion) {
    refuse(idx, 9, "version " + std::to_string(version) + ", expected 1", kRebuild);
  }
  const uint8_t code = idx_[17];
  if (!knownDType(code)) {
    refuse(idx, 17,
           "dtype code " + std::to_string(code) +
               " is not one of megatron's (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)",
           kRebuild);
  }
  dtype_ = static_cast<IndexedDType>(code);
  item_size_ = indexedDTypeSize(dtype_);

  const uint64_t sequences = load<uint64_t>(idx_ + 18);
  const uint64_t documents = load<uint64_t>(idx_ + 26);
  // Bound the counts by the file size before multiplying, so that garbage
  // counts cannot overflow the size arithmetic below.
  const auto room = static_cast<uint64_t>(idx_bytes_ - kIndexedHeaderBytes);
  if (sequences > room / 12) {
    refuse(idx, 18,
           "sequence count " + std::to_string(sequences) + " does not fit in the " + std::to_string(room) +
               " bytes after the header (12 bytes each for a length and a pointer)",
           "the file is truncated or its header is damaged; " + std::string(kRebuild));
  }
  if (documents > room / 8) {
    refuse(idx, 26,
           "document index count " + std::to_string(documents) + " does not fit in the " + std::to_string(room) +
               " bytes after the header",
           "the file is truncated or its header is damaged; " + std::string(kRebuild));
  }
  if (documents < 1) {
    refuse(idx, 26, "document index count 0; megatron writes at least one (the leading 0)", kRebuild);
  }
  const auto s = static_cast<int64_t>(sequences);
  const auto d = static_cast<int64_t>(documents);
  sequence_count_ = s;
  document_index_count_ = d;
  lengths_at_ = kIndexedHeaderBytes;
  pointers_at_ = lengths_at_ + 4 * s;
  documents_at_ = pointers_at_ + 8 * s;
  modes_at_ = documents_at_ + 8 * d;
  const int64_t plain = modes_at_;
  const int64_t multimodal = modes_at_ + s;
  if (idx_bytes_ == multimodal && s > 0) {
    has_modes_ = true;
  } else if (idx_bytes_ != plain) {
    refuse(idx, std::min(idx_bytes_, plain),
           "the file is " + std::to_string(idx_bytes_) + " bytes but its header's counts (" + std::to_string(s) +
               " sequences, " + std::to_string(d) + " document indices) make it " + std::to_string(plain) +
               " (or " + std::to_string(multimodal) + " with multimodal sequence modes)",
           std::string(idx_bytes_ < plain ? "the file is truncated; " : "the file has trailing bytes; ") + kRebuild);
  }

  // Lengths and pointers together: each sequence inside the .bin and not
  // before the end of the one before it (megatron writes them back to back).
  int64_t previous_end = 0;
  for (int64_t i = 0; i < s; ++i) {
    const int32_t length = lengthAt(i);
    if (length < 0) {
      refuse(idx, lengths_at_ + 4 * i, "sequence " + std::to_string(i) + " has length " + std::to_string(length), kRebuild);
    }
    const int64_t pointer = pointerAt(i);
    if (pointer < previous_end) {
      refuse(idx, pointers_at_ + 8 * i,
             "sequence " + std::to_string(i) + " starts at .bin byte " + std::to_string(pointer) +
                 ", before the end of the sequence before it (byte " + std::to_string(previous_end) + ")",
             "the pointers must rise with the sequences; " + std::string(kRebuild));
    }
    if (pointer > bin_bytes_ || length * item_size_ > bin_bytes_ - pointer) {
      refuse(idx, pointers_at_ + 8 * i,
             "sequence " + std::to_string(i) + " (" + std::to_string(length) + " " + indexedDTypeName(dtype_) +
                 " tokens at .bin byte " + std::to_string(pointer) + ") ends at byte " +
                 std::to_string(pointer + length * item_size_) + ", past the end of " + bin + " (" +
                 std::to_string(bin_bytes_) + " bytes)",
             "the .bin is truncated or belongs to another index; " + std::string(kRebuild));
    }
    previous_end = pointer + length * item_size_;
  }
  if (previous_end != bin_bytes_) {
    refuse(bin, previous_end,
           "the file is " + std::to_string(bin_bytes_) + " bytes but " + idx + "'s last sequence ends at byte " +
               std::to_string(previous_end),
           "the .bin has trailing data or belongs to another index; " + std::string(kRebuild));
  }

  int64_t previous = 0;
  for (int64_t k = 0; k < d; ++k) {
    const int64_t first = documentAt(k);
    if (k == 0 && first != 0) {
      refuse(idx, documents_at_, "the document indices start at " + std::to_string(first) + ", not 0", kRebuild);
    }
    if (first < previous || first > s) {
      refuse(idx, documents_at_ + 8 * k,
             "document index " + std::to_string(k) + " is " + std::to_string(first) + ", outside [" +
                 std::to_string(previous) + ", " + std::to_string(s) + "] (they must rise to the sequence count)",
             kRebuild);
    }
    previous = first;
  }
  if (previous != s) {
    refuse(idx, documents_at_ + 8 * (d - 1),
           "the last document index is " + std::to_string(previous) + ", not the sequence count " + std::to_string(s),
           "the index is damaged; " + std::string(kRebuild));
  }
}

int32_t IndexedDataset::lengthAt(int64_t i) const { return load<int32_t>(idx_ + lengths_at_ + 4 * i); }
int64_t IndexedDataset::pointerAt(int64_t i) const { return load<int64_t>(idx_ + pointers_at_ + 8 * i); }
int64_t IndexedDataset::documentAt(int64_t d) const { return load<int64_t>(idx_ + documents_at_ + 8 * d); }

int64_t IndexedDataset::sequenceLength(int64_t i) const {
  if (i < 0 || i >= sequence_count_) {
    throw std::out_of_range(prefix_ + ": sequence " + std::to_string(i) + " of " + std::to_string(sequence_count_));
  }
  return lengthAt(i);
}

int64_t IndexedDataset::sequencePointer(int64_t i) const {
  if (i < 0 || i >= sequence_count_) {
    throw std::out_of_range(prefix_ + ": sequence " + std::to_string(i) + " of " + std::to_string(sequence_count_));
  }
  return pointerAt(i);
}

int64_t IndexedDataset::documentIndex(int64_t d) const {
  if (d < 0 || d >= document_index_count_) {
    throw std::out_of_range(prefix_ + ": document index " + std::to_string(d) + " of " +
                            std::to_string(document_index_count_));
  }
  return documentAt(d);
}

int8_t IndexedDataset::sequenceMode(int64_t i) const {
  if (!has_modes_ || i < 0 || i >= sequence_count_) {
    throw std::out_of_range(prefix_ + ": no sequence mode " + std::to_string(i) +
                            (has_modes_ ? "" : " (the index has no multimodal modes)"));
  }
  return static_cast<int8_t>(idx_[modes_at_ + i]);
}

namespace {

template <typename T>
void widen(const unsigned char* from, int64_t n, int64_t* out) {
  for (int64_t k = 0; k < n; ++k) out[k] = static_cast<int64_t>(load<T>(from + k * static_cast<int64_t>(sizeof(T))));
}

// A float token must be a whole number in int64's range to be a token id.
template <typename T>
void widenFloat(const unsigned char* from, int64_t n, int64_t* out, const std::string& bin, int64_t first_byte) {
  for (int64_t k = 0; k < n; ++k) {
    const T value = load<T>(from + k * static_cast<int64_t>(sizeof(T)));
    if (!(std::floor(value) == value) || !(std::fabs(static_cast<double>(value)) < 9.2e18)) {
      refuse(bin, first_byte + k * static_cast<int64_t>(sizeof(T)),
             "token " + text::formatNumber(static_cast<double>(value)) + " is not a whole number, so not a token id",
             "write token ids with an integer dtype (uint16 or int32); " + std::string(kRebuild));
    }
    out[k] = static_cast<int64_t>(value);
  }
}

}  // namespace

void IndexedDataset::read(int64_t i, int64_t offset, int64_t length, int64_t* out) const {
  const int64_t size = sequenceLength(i);
  if (offset < 0 || length < 0 || offset > size || length > size - offset) {
    throw std::out_of_range(prefix_ + ": tokens [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                            ") of sequence " + std::to_string(i) + ", which has " + std::to_string(size));
  }
  if (length == 0) return;
  const int64_t begin = pointerAt(i) + offset * item_size_;
  const int64_t end = begin + length * item_size_;
  const unsigned char* from = bin_ + begin;
  switch (dtype_) {
    case IndexedDType::kUint8: widen<uint8_t>(from, length, out); break;
    case IndexedDType::kInt8: widen<int8_t>(from, length, out); break;
    case IndexedDType::kInt16: widen<int16_t>(from, length, out); break;
    case IndexedDType::kUint16: widen<uint16_t>(from, length, out); break;
    case IndexedDType::kInt32: widen<int32_t>(from, length, out); break;
    case IndexedDType::kInt64: widen<int64_t>(from, length, out); break;
    case IndexedDType::kFloat32: widenFloat<float>(from, length, out, binPath(), begin); break;
    case IndexedDType::kFloat64: widenFloat<double>(from, length, out, binPath(), begin); break;
  }
  bytes_read_.fetch_add(static_cast<uint64_t>(end - begin), std::memory_order_relaxed);
  if (observer_) observer_(IndexedBinRead{i, begin, end});
}

std::vector<int64_t> IndexedDataset::read(int64_t i, int64_t offset, int64_t length) const {
  const int64_t size = sequenceLength(i);
  if (length < 0) length = offset >= 0 && offset <= size ? size - offset : 0;
  std::vector<int64_t> tokens(static_cast<size_t>(length));
  read(i, offset, length, tokens.data());
  return tokens;
}

}  // namespace ptrain::datasets

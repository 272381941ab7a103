// Safetensors: the tensor file format of every ptrain checkpoint.
//
// The format is the published one (github.com/huggingface/safetensors), so
// the files open in PyTorch, JAX or NumPy without ptrain:
//
//   bytes 0..7        N, the header length, unsigned 64-bit little-endian
//   bytes 8..8+N      a UTF-8 JSON object, padded with spaces:
//                       {"<name>": {"dtype": "F32", "shape": [2, 3],
//                                   "data_offsets": [begin, end]}, ...,
//                        "__metadata__": {"<key>": "<value>", ...}}
//   bytes 8+N..       the data: every tensor's elements, row-major,
//                     little-endian; offsets count from the first data byte
//
// ptrain writes N as a multiple of 8 (so every tensor starts 8-byte aligned
// when the file is mapped), stores the tensors in ascending name order, back
// to back, and omits "__metadata__" when there is none. The reader accepts any
// valid file: tensors in any order, any header padding, but it refuses holes,
// overlaps and trailing bytes just as the reference implementation does.
//
// Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain {

// One tensor's header entry, as stored in the file.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;           // "F32", "BF16", ...
  std::vector<int64_t> shape;  // [] for a 0-dim tensor
  uint64_t begin = 0;          // data_offsets, relative to the first data byte
  uint64_t end = 0;
};

// A whole file read into memory.
struct PTRAIN_API SafetensorsFile {
  SafetensorsFile();
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  SafetensorsFile(const SafetensorsFile&);
  SafetensorsFile& operator=(const SafetensorsFile&);

  std::string path;  // where it was read from, for error messages
  // name -> CPU tensor that owns its memory (nothing refers to the file).
  std::map<std::string, at::Tensor> tensors;
  // The "__metadata__" object; empty when the file has none.
  std::map<std::string, std::string> metadata;

  // The tensor `name`; throws CheckpointError naming the file and the tensor
  // when it is absent.
  const at::Tensor& get(const std::string& name) const;
  bool contains(const std::string& name) const { return tensors.count(name) != 0; }
};

// zlib's CRC-32 (Python's zlib.crc32) of a file: whole, and of each
// `block_bytes` block of it (the last one shorter), so that a reader of part
// of the file can check exactly the blocks it reads.
struct PTRAIN_API FileChecksum {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  uint64_t block_bytes = 0;
  std::vector<uint32_t> block_crc32;
};

// The checksum block of every file ptrain writes.
constexpr uint64_t kChecksumBlockBytes = uint64_t{1} << 20;

// A tensor's header entry before its data is at hand.
struct SafetensorsTensorSpec {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

// Writes a file in the format above one tensor at a time: the header from
// the specs first, then each tensor's data in order() (ascending names), so
// only one tensor needs to be in memory. saveSafetensors is this writer.
// Throws CheckpointError (with the path) as saveSafetensors does, and for a
// tensor appended out of order or of another dtype or shape than its spec.
class PTRAIN_API SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<SafetensorsTensorSpec> specs,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  // The order the tensors' data must be appended in.
  const std::vector<SafetensorsTensorSpec>& order() const { return specs_; }
  // The next tensor's data (copied to host memory while it is written).
  void append(const at::Tensor& tensor);
  // Closes the file after the last tensor; returns its checksum.
  FileChecksum finish();

 private:
  void write(const void* data, size_t size);

  std::string path_;
  std::vector<SafetensorsTensorSpec> specs_;
  size_t next_ = 0;
  int fd_ = -1;
  FileChecksum checksum_;
  uint32_t blockCrc_ = 0;
  uint64_t blockFill_ = 0;
};

// Writes `tensors` and `metadata` to `path` (created or truncated) in the
// format above. Each tensor is detached and copied to CPU contiguous memory one
// at a time while writing, so peak extra memory is the largest tensor. Names
// must be unique, non-empty and not "__metadata__".
//
// The file itself is written in place, not atomically, and not fsync'ed: write
// it inside writeCheckpointAtomically() (checkpoint_io.h), which does both for
// the whole checkpoint folder.
// Throws CheckpointError (with the path) for an undefined tensor, an
// unsupported dtype (e.g. complex), a bad or duplicate name, or an I/O error.
// Thread-safe for distinct paths.
// With `checksum`, receives the file's CRC-32 (whole and per block).
PTRAIN_API void saveSafetensors(const std::string& path,
                                const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                const std::map<std::string, std::string>& metadata = {},
                                FileChecksum* checksum = nullptr);

// Reads and validates only the header of `path`; entries in ascending order of
// data offset. `metadata`, when not null, receives "__metadata__";
// `dataStart`, the file offset of the first data byte (entries' offsets count
// from there). Throws CheckpointError as loadSafetensors() does.
PTRAIN_API std::vector<SafetensorsEntry> readSafetensorsHeader(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr, uint64_t* dataStart = nullptr);

// Reads the whole of `path`. Every malformed input (a missing or truncated
// file, a header length past the end of the file, a header that is not a JSON
// object, an unknown dtype, a bad shape, data offsets that are out of range,
// overlap, leave holes or do not match shape x item size, a BOOL byte other
// than 0 or 1) throws
// CheckpointError with one line "<path>: <what is wrong>".
// Thread-safe.
PTRAIN_API SafetensorsFile loadSafetensors(const std::string& path);

// The safetensors dtype name of a torch dtype ("F32" for at::kFloat, ...);
// throws CheckpointError for a dtype the format cannot hold.
PTRAIN_API std::string safetensorsDtypeName(at::ScalarType type);

}  // namespace ptrain

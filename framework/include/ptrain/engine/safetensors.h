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
PTRAIN_API void saveSafetensors(const std::string& path,
                                const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                const std::map<std::string, std::string>& metadata = {});

// Reads and validates only the header of `path`; entries in ascending order of
// data offset. `metadata`, when not null, receives "__metadata__".
// Throws CheckpointError as loadSafetensors() does.
PTRAIN_API std::vector<SafetensorsEntry> readSafetensorsHeader(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

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

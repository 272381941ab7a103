// Sharded checkpoints: each rank writes the part of every tensor it owns, one
// index names every tensor's whole shape, dtype and the blocks that make it
// up, and a reader takes any block of any tensor by intersecting it with the
// saved ones, reading only the bytes it needs (docs/checkpoints.md).
//
// On disk, in RUN_DIR/checkpoints/step_N/:
//   <runtime>.rank<RRRRR>.safetensors  what rank R owns of runtime <runtime>'s
//       tensors (parameters under their names, optimizer state as
//       "<slot>.<param>", the precision plugin's as "precision.<name>"), each
//       stored as the rank's local block; a valid safetensors file on its own.
//   index.json  {"format": "ptrain.sharded", "version": 1, "step": N,
//       "files": {file: {"bytes", "crc32", "block_bytes", "block_crc32": [...]}},
//       "runtimes": {runtime: {"parameters": {name: entry}, "optimizer": {name: entry}}}}
//     where entry = {"dtype": "F32", "shape": [whole sizes],
//                    "shards": [{"file", "offsets": [...], "sizes": [...], "flat": [b, e]?}]}.
//     A shard is the block of the whole tensor starting at `offsets` with
//     `sizes`; with `flat` the file holds only elements [b, e) of that block
//     in row-major order (a distributed optimizer's range, Megatron's
//     flattened_range). Checksums are zlib's CRC-32 (Python's zlib.crc32) of
//     the whole file and of each `block_bytes` block of it, so a reader that
//     reads part of a file checks the blocks it reads.
//   meta.json   as before (step, RNG, recipe, per runtime its layout and
//               optimizer step), plus "format": "ptrain.sharded".
// A folder without index.json is a checkpoint of an earlier ptrain: whole
// tensors in <runtime>.model.safetensors / .optimizer.safetensors
// ("model.safetensors" / "optimizer.safetensors" for the runtime "model");
// the reader serves it the same way, each tensor one block covering it all.
//
// Thread-safety: a CheckpointReader is used by one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include "ptrain/core/error.h"

namespace ptrain {

class ModelRuntime;
class ProcessGroup;

// A block of a tensor: [offsets[d], offsets[d] + sizes[d]) along every
// dimension d, and optionally only the elements [flat_begin, flat_end) of
// that block in row-major order (flat_begin < 0: all of it).
struct PTRAIN_API TensorBlock {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int64_t flat_begin = -1;
  int64_t flat_end = -1;

  bool flat() const { return flat_begin >= 0; }
  // Elements the block holds: the product of sizes, or the flat range's length.
  int64_t numel() const;
  // The whole of a tensor of `sizes`.
  static TensorBlock whole(const std::vector<int64_t>& sizes);
};

// Which file of a runtime a tensor belongs to.
enum class CheckpointSection { kParameters, kOptimizer };
PTRAIN_API const char* toString(CheckpointSection section);

// One tensor a rank writes: its local part and where that sits in the whole.
struct PTRAIN_API ShardedTensor {
  std::string name;
  at::Tensor local;                 // the block's elements (flat: 1-d of the range's length)
  std::vector<int64_t> full_sizes;  // the whole tensor's
  TensorBlock block;
};

// Everything one rank writes of one runtime.
struct PTRAIN_API RankShare {
  std::vector<ShardedTensor> parameters;
  std::vector<ShardedTensor> optimizer;
  bool empty() const { return parameters.empty() && optimizer.empty(); }
};

// "<runtime>.rank<RRRRR>.safetensors".
PTRAIN_API std::string shardFileName(const std::string& runtime, int rank);

// Writes `share` of `runtime` to `dir`/shardFileName(runtime, rank) (nothing
// when the share is empty) and returns this rank's part of the index:
// {"files": {file: checksum}, "runtimes": {runtime: {"parameters": {name:
// entry}, "optimizer": {...}}}} with one shard per tensor. Throws
// CheckpointError (naming the file) on an I/O error.
PTRAIN_API nlohmann::json writeRankShare(const std::string& dir, const std::string& runtime, int rank,
                                         const RankShare& share);

// Merges the ranks' parts into one index for `step` and checks it: every
// tensor's shards agree on dtype and shape, lie inside it and cover every
// element exactly once. Throws InternalError naming the tensor otherwise.
PTRAIN_API nlohmann::json mergeIndexParts(const std::vector<nlohmann::json>& parts, int64_t step);

// The index file of a sharded step folder.
constexpr const char* kCheckpointIndexFile = "index.json";

class PTRAIN_API CheckpointReader {
 public:
  struct TensorInfo {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
  };

  // Opens the step folder `dir`: its index.json, or the whole-tensor files of
  // an earlier ptrain (read lazily, header by header). Throws CheckpointError
  // naming the folder when it holds neither, or the index is malformed.
  explicit CheckpointReader(std::string dir);
  // Opens one safetensors file (a bare state dict, not a ptrain folder) as
  // the whole-tensor parameters of any runtime: no optimizer section, no
  // checksums. Throws CheckpointError naming the file when it is missing or
  // its header is not safetensors.
  static std::unique_ptr<CheckpointReader> openFile(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& dir() const { return dir_; }
  // True for a sharded folder (index.json), false for whole-tensor files.
  bool sharded() const { return sharded_; }
  // Whether the folder holds tensors of `runtime` (sharded: in the index;
  // whole-tensor: its model file exists).
  bool hasRuntime(const std::string& runtime) const;
  // The tensor's dtype and whole shape, or nullopt when it is not saved.
  std::optional<TensorInfo> find(const std::string& runtime, CheckpointSection section, const std::string& name);
  // Every tensor name of the section, sorted.
  std::vector<std::string> names(const std::string& runtime, CheckpointSection section);

  // Fills `out` with the elements `block` of tensor `name` (sizes: the
  // block's, or [flat_end - flat_begin] for a flat block), converted to out's
  // dtype (out may be on any device). Reads only the byte ranges of the files
  // that hold those elements, and checks the CRC-32 of every checksum block
  // it reads. Throws CheckpointError naming the file and what is wrong: a
  // missing tensor, a block outside it, a file that is missing, shorter than
  // the index says, or whose bytes fail their checksum.
  void read(const std::string& runtime, CheckpointSection section, const std::string& name, const TensorBlock& block,
            at::Tensor& out);
  // The whole tensor, as saved (its dtype), on the host.
  at::Tensor readWhole(const std::string& runtime, CheckpointSection section, const std::string& name);

  // Bytes read from files so far (data and the checksum blocks around it).
  uint64_t bytesRead() const;

 private:
  struct Impl;
  CheckpointReader(std::string dir, std::string file);
  std::string dir_;
  bool sharded_ = false;
  std::unique_ptr<Impl> impl_;
};

// Collective over `world` (every rank calls it with the same runtimes, which
// span the world): each rank writes its share of every runtime
// (ModelRuntime::checkpointShare) into the existing folder `dir` and syncs
// it, then the world's rank 0 merges the ranks' index parts and writes
// index.json there. Returns the bytes this rank wrote. When any rank fails,
// every rank throws CheckpointError: that rank its own error, the others one
// naming the rank that failed; nothing is left half-agreed.
PTRAIN_API uint64_t writeShardedCheckpoint(const std::string& dir, int64_t step,
                                           const std::vector<ModelRuntime*>& runtimes, ProcessGroup& world);

// Collective over `world`: every rank learns whether any rank failed. With
// `error` empty on every rank, returns; otherwise the ranks that failed throw
// CheckpointError(`error`), and the others PeerFailedError "<what>: stopped,
// because rank R failed (its own line says why)" (exit code 5: a
// consequence, which the launcher does not blame). Collective tensors live on
// `device`.
PTRAIN_API void agreeOnFailure(ProcessGroup& world, at::Device device, const std::string& error,
                               const std::string& what);

// Collective over `group`: every member's `text`, in rank order.
PTRAIN_API std::vector<std::string> allGatherStrings(ProcessGroup& group, const std::string& text, at::Device device);

// Writes the checkpoint folder `stepDir` (sharded or whole-tensor) to `outDir`
// as whole-tensor files: per runtime <runtime>.model.safetensors and
// <runtime>.optimizer.safetensors ("model.safetensors" and
// "optimizer.safetensors" for the runtime "model"), with {"format": "pt"}
// metadata, and a copy of meta.json without the sharded format mark: the
// whole-tensor layout of checkpoints before sharding. One tensor is held at a
// time. Any safetensors reader loads the files, and ptrain resumes from them. Throws
// CheckpointError for a damaged checkpoint or an unwritable folder.
PTRAIN_API void consolidateCheckpoint(const std::string& stepDir, const std::string& outDir);

}  // namespace ptrain

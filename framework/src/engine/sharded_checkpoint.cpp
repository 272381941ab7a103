#include "ptrain/engine/sharded_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <set>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "ptrain/comm/process_group.h"
#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/engine/runtime.h"
#include "ptrain/engine/safetensors.h"

namespace fs = std::filesystem;

namespace ptrain {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "ptrain.sharded";
constexpr int kVersion = 1;
// Reads through a staging buffer (a dtype conversion, a device) in pieces of
// at most this many bytes, so a reader never holds more than that beside the
// tensor it fills.
constexpr uint64_t kStagingBytes = uint64_t{4} << 20;

const char* sectionKey(CheckpointSection section) {
  return section == CheckpointSection::kParameters ? "parameters" : "optimizer";
}

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

bool parseHex32(const json& v, uint32_t* out) {
  if (!v.is_string()) return false;
  const std::string& s = v.get_ref<const std::string&>();
  if (s.size() != 8 || s.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  *out = static_cast<uint32_t>(std::stoul(s, nullptr, 16));
  return true;
}

at::ScalarType dtypeOfName(const std::string& name, const std::string& where) {
  for (at::ScalarType t : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort,
                           at::kChar, at::kByte, at::kBool}) {
    if (safetensorsDtypeName(t) == name) return t;
  }
  throw CheckpointError(detail::concat(where, ": unknown dtype \"", name, "\""));
}

json blockJson(const std::string& file, const TensorBlock& block) {
  json shard{{"file", file}, {"offsets", block.offsets}, {"sizes", block.sizes}};
  if (block.flat()) shard["flat"] = {block.flat_begin, block.flat_end};
  return shard;
}

int64_t product(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

// Whether two shards of one tensor share an element. Blocks that overlap
// share one, unless both are disjoint flat ranges of the same block (two
// data-parallel ranks' pieces of one tensor-parallel shard).
bool overlap(const TensorBlock& a, const TensorBlock& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] + a.sizes[d] <= b.offsets[d] || b.offsets[d] + b.sizes[d] <= a.offsets[d]) return false;
  }
  if (a.flat() && b.flat() && a.offsets == b.offsets && a.sizes == b.sizes) {
    return a.flat_begin < b.flat_end && b.flat_begin < a.flat_end;
  }
  return true;
}

// A whole-tensor checkpoint's file of `runtime`'s `section`.
std::string wholeFile(const std::string& runtime, CheckpointSection section) {
  const std::string kind = section == CheckpointSection::kParameters ? "model" : "optimizer";
  return (runtime == "model" ? kind : runtime + "." + kind) + ".safetensors";
}

TensorBlock blockFromJson(const json& shard, size_t dims, const std::string& where) {
  TensorBlock b;
  b.offsets = shard.at("offsets").get<std::vector<int64_t>>();
  b.sizes = shard.at("sizes").get<std::vector<int64_t>>();
  if (b.offsets.size() != dims || b.sizes.size() != dims) {
    throw CheckpointError(where + ": a shard's offsets or sizes do not match the tensor's dimensions");
  }
  if (shard.contains("flat")) {
    const auto range = shard.at("flat").get<std::vector<int64_t>>();
    if (range.size() != 2 || range[0] < 0 || range[1] < range[0] || range[1] > product(b.sizes)) {
      throw CheckpointError(where + ": a shard's flat range is outside its block");
    }
    b.flat_begin = range[0];
    b.flat_end = range[1];
  }
  return b;
}

}  // namespace

int64_t TensorBlock::numel() const { return flat() ? flat_end - flat_begin : product(sizes); }

TensorBlock TensorBlock::whole(const std::vector<int64_t>& sizes) {
  TensorBlock b;
  b.offsets.assign(sizes.size(), 0);
  b.sizes = sizes;
  return b;
}

const char* toString(CheckpointSection section) { return sectionKey(section); }

std::string shardFileName(const std::string& runtime, int rank) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%05d", rank);
  return runtime + ".rank" + buf + ".safetensors";
}

json writeRankShare(const std::string& dir, const std::string& runtime, int rank, const RankShare& share) {
  json part{{"files", json::object()}, {"runtimes", json::object()}};
  if (share.empty()) return part;
  const std::string file = shardFileName(runtime, rank);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::set<std::string> names;
  json sections = json::object();
  for (CheckpointSection section : {CheckpointSection::kParameters, CheckpointSection::kOptimizer}) {
    json entries = json::object();
    for (const ShardedTensor& t : section == CheckpointSection::kParameters ? share.parameters : share.optimizer) {
      PTRAIN_CHECK(names.insert(t.name).second, "checkpoint share of '", runtime, "' names '", t.name, "' twice");
      PTRAIN_CHECK(t.local.numel() == t.block.numel(), "checkpoint share: '", t.name, "' holds ", t.local.numel(),
                   " elements for a block of ", t.block.numel());
      tensors.emplace_back(t.name, t.local);
      entries[t.name] = {{"dtype", safetensorsDtypeName(t.local.scalar_type())},
                         {"shape", t.full_sizes},
                         {"shards", json::array({blockJson(file, t.block)})}};
    }
    sections[sectionKey(section)] = std::move(entries);
  }
  FileChecksum checksum;
  saveSafetensors((fs::path(dir) / file).string(), tensors, {{"format", "pt"}}, &checksum);
  json blocks = json::array();
  for (uint32_t c : checksum.block_crc32) blocks.push_back(hex32(c));
  part["files"][file] = {{"bytes", checksum.bytes},
                         {"crc32", hex32(checksum.crc32)},
                         {"block_bytes", checksum.block_bytes},
                         {"block_crc32", std::move(blocks)}};
  part["runtimes"][runtime] = std::move(sections);
  return part;
}

json mergeIndexParts(const std::vector<json>& parts, int64_t step) {
  json index{{"format", kFormat}, {"version", kVersion}, {"step", step}, {"files", json::object()},
             {"runtimes", json::object()}};
  for (const json& part : parts) {
    for (const auto& [file, record] : part.at("files").items()) {
      PTRAIN_CHECK(!index["files"].contains(file), "checkpoint: two ranks wrote ", file);
      index["files"][file] = record;
    }
    for (const auto& [runtime, sections] : part.at("runtimes").items()) {
      json& merged = index["runtimes"][runtime];
      for (const auto& [section, entries] : sections.items()) {
        json& into = merged[section];
        if (into.is_null()) into = json::object();
        for (const auto& [name, entry] : entries.items()) {
          if (!into.contains(name)) {
            into[name] = entry;
            continue;
          }
          json& have = into[name];
          PTRAIN_CHECK(have["dtype"] == entry["dtype"] && have["shape"] == entry["shape"], "checkpoint: ranks disagree on ",
                       runtime, " ", section, " '", name, "': ", have["dtype"].dump(), have["shape"].dump(), " and ",
                       entry["dtype"].dump(), entry["shape"].dump());
          for (const auto& shard : entry["shards"]) have["shards"].push_back(shard);
        }
      }
    }
  }
  // Every element of every tensor exactly once.
  for (auto& [runtime, sections] : index["runtimes"].items()) {
    for (auto& [section, entries] : sections.items()) {
      for (auto& [name, entry] : entries.items()) {
        const auto shape = entry["shape"].get<std::vector<int64_t>>();
        std::vector<TensorBlock> blocks;
        int64_t covered = 0;
        for (const auto& shard : entry["shards"]) {
          TensorBlock b = blockFromJson(shard, shape.size(), name);
          for (size_t d = 0; d < shape.size(); ++d) {
            PTRAIN_CHECK(b.offsets[d] >= 0 && b.offsets[d] + b.sizes[d] <= shape[d], "checkpoint: a shard of ",
                         runtime, " '", name, "' lies outside its shape");
          }
          for (const TensorBlock& other : blocks) {
            PTRAIN_CHECK(!overlap(b, other), "checkpoint: two shards of ", runtime, " '", name, "' overlap");
          }
          covered += b.numel();
          blocks.push_back(std::move(b));
        }
        PTRAIN_CHECK(covered == product(shape), "checkpoint: the shards of ", runtime, " ", section, " '", name,
                     "' hold ", covered, " of its ", product(shape), " elements");
      }
    }
  }
  return index;
}

// ---- reading ----

// Its types are members, not file-local: Impl has the linkage of the class
// it implements.
struct CheckpointReader::Impl {
  // Closes a descriptor on every path out.
  struct FileHandle {
    int fd = -1;
    ~FileHandle() {
      if (fd >= 0) ::close(fd);
    }
  };

  // One saved block of a tensor, and where its elements sit.
  struct ShardRef {
    std::string file;
    TensorBlock block;
  };

  struct Entry {
    at::ScalarType dtype = at::kFloat;
    std::vector<int64_t> shape;
    std::vector<ShardRef> shards;
  };

  struct File {
    std::string path;
    FileHandle handle;
    uint64_t size = 0;
    std::optional<FileChecksum> checksum;  // none for a whole-tensor file
    bool headerRead = false;
    uint64_t dataStart = 0;
    std::map<std::string, SafetensorsEntry> tensors;
    // The last few checksum blocks read in part (verified), so that tensors
    // read in another order than written (a parameter, then its optimizer
    // slots) do not read and check the same block again; at most
    // kCachedBlocks of them, the oldest dropped first.
    std::deque<std::pair<int64_t, std::vector<char>>> cached;
    const std::vector<char>* cachedBlock(int64_t block) const {
      for (const auto& [b, bytes] : cached)
        if (b == block) return &bytes;
      return nullptr;
    }
  };

  std::string dir;
  bool sharded = false;
  std::map<std::string, File> files;
  // runtime -> section -> name -> entry (sharded: all from the index;
  // whole-tensor: filled per file header as asked).
  std::map<std::string, std::map<std::string, std::map<std::string, Entry>>> entries;
  std::set<std::string> wholeFilesRead;
  uint64_t bytesRead = 0;
  // A bare safetensors file (CheckpointReader::openFile): its name in `dir`,
  // served as every runtime's parameters.
  std::string bareFile;

  // The whole-tensor file of `runtime`'s `section`, or "" when there is none.
  std::string wholeFileOf(const std::string& runtime, CheckpointSection section) const {
    if (bareFile.empty()) return wholeFile(runtime, section);
    return section == CheckpointSection::kParameters ? bareFile : "";
  }

  File& file(const std::string& name) {
    auto it = files.find(name);
    if (it == files.end()) {
      File f;
      f.path = (fs::path(dir) / name).string();
      it = files.emplace(name, std::move(f)).first;
    }
    File& f = it->second;
    if (f.handle.fd < 0) {
      f.handle.fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (f.handle.fd < 0) {
        throw CheckpointError(detail::concat(f.path, ": ", errno == ENOENT ? "file not found" : std::strerror(errno),
                                             " (the checkpoint is incomplete)"));
      }
      struct stat st {};
      if (::fstat(f.handle.fd, &st) != 0) {
        throw CheckpointError(detail::concat(f.path, ": cannot stat (", std::strerror(errno), ")"));
      }
      f.size = static_cast<uint64_t>(st.st_size);
      if (f.checksum && f.checksum->bytes != f.size) {
        throw CheckpointError(detail::concat(f.path, ": ", f.size, " bytes, but ", kCheckpointIndexFile, " says ",
                                             f.checksum->bytes, ": the file is damaged or truncated"));
      }
    }
    return f;
  }

  void preadAll(File& f, char* dst, uint64_t n, uint64_t offset) {
    while (n > 0) {
      const ssize_t got = ::pread(f.handle.fd, dst, n, static_cast<off_t>(offset));
      if (got < 0) {
        if (errno == EINTR) continue;
        throw CheckpointError(detail::concat(f.path, ": read failed (", std::strerror(errno), ")"));
      }
      if (got == 0) throw CheckpointError(detail::concat(f.path, ": file ended early at byte ", offset));
      dst += got;
      n -= static_cast<uint64_t>(got);
      offset += static_cast<uint64_t>(got);
      bytesRead += static_cast<uint64_t>(got);
    }
  }

  void verify(File& f, int64_t block, const char* data, uint64_t length) {
    const uint32_t crc = static_cast<uint32_t>(crc32_z(0, reinterpret_cast<const Bytef*>(data), length));
    if (crc != f.checksum->block_crc32[static_cast<size_t>(block)]) {
      const uint64_t begin = static_cast<uint64_t>(block) * f.checksum->block_bytes;
      throw CheckpointError(detail::concat(f.path, ": bytes [", begin, ", ", begin + length,
                                           ") do not match their checksum in ", kCheckpointIndexFile,
                                           ": the file is damaged (restore it, or resume from an earlier step)"));
    }
  }

  // Bytes [offset, offset + n) of `f` into dst, every checksum block they
  // touch verified.
  void readBytes(File& f, uint64_t offset, uint64_t n, char* dst) {
    if (offset + n > f.size) {
      throw CheckpointError(detail::concat(f.path, ": bytes [", offset, ", ", offset + n, ") run past its end (",
                                           f.size, " bytes): the file is damaged"));
    }
    if (!f.checksum) {
      preadAll(f, dst, n, offset);
      return;
    }
    const uint64_t blockBytes = f.checksum->block_bytes;
    while (n > 0) {
      const auto block = static_cast<int64_t>(offset / blockBytes);
      const uint64_t begin = static_cast<uint64_t>(block) * blockBytes;
      const uint64_t end = std::min(begin + blockBytes, f.size);
      const uint64_t take = std::min(n, end - offset);
      const std::vector<char>* hit = f.cachedBlock(block);
      if (offset == begin && take == end - begin && hit == nullptr) {
        // A whole block: straight into place, checked there.
        preadAll(f, dst, take, offset);
        verify(f, block, dst, take);
      } else {
        if (hit == nullptr) {
          constexpr size_t kCachedBlocks = 4;
          std::vector<char> bytes(end - begin);
          preadAll(f, bytes.data(), end - begin, begin);
          verify(f, block, bytes.data(), end - begin);
          if (f.cached.size() == kCachedBlocks) f.cached.pop_front();
          f.cached.emplace_back(block, std::move(bytes));
          hit = &f.cached.back().second;
        }
        std::memcpy(dst, hit->data() + (offset - begin), take);
      }
      offset += take;
      dst += take;
      n -= take;
    }
  }

  void readHeader(File& f) {
    if (f.headerRead) return;
    // The header's own bytes are checked before anything trusts them.
    unsigned char lengthBytes[8];
    if (f.size < 8) throw CheckpointError(f.path + ": too short for a safetensors file: the file is damaged");
    readBytes(f, 0, 8, reinterpret_cast<char*>(lengthBytes));
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | lengthBytes[i];
    if (length > f.size - 8) throw CheckpointError(f.path + ": header length past the end of the file: damaged");
    std::vector<char> header(length);
    readBytes(f, 8, length, header.data());
    uint64_t dataStart = 0;
    for (auto& e : readSafetensorsHeader(f.path, nullptr, &dataStart)) f.tensors.emplace(e.name, std::move(e));
    f.dataStart = dataStart;
    f.headerRead = true;
  }

  std::map<std::string, Entry>& sectionEntries(const std::string& runtime, CheckpointSection section) {
    auto& map = entries[runtime][sectionKey(section)];
    if (sharded) return map;
    const std::string name = wholeFileOf(runtime, section);
    if (!name.empty() && wholeFilesRead.insert(name).second && fs::exists(fs::path(dir) / name)) {
      File& f = file(name);
      readHeader(f);
      for (const auto& [key, e] : f.tensors) {
        Entry entry;
        entry.dtype = dtypeOfName(e.dtype, f.path);
        entry.shape = e.shape;
        entry.shards.push_back(ShardRef{name, TensorBlock::whole(e.shape)});
        map[key] = std::move(entry);
      }
    }
    return map;
  }

  // Copies the elements of `target` that `source` holds from the file into
  // host memory `out` (contiguous, of the target block's element count, in
  // dtype out.scalar_type()); returns how many.
  int64_t copyIntersection(const std::string& name, const Entry& entry, const ShardRef& source,
                           const TensorBlock& target, at::Tensor& out) {
    // A shard that holds none of the target's elements is not even opened.
    for (size_t d = 0; d < entry.shape.size(); ++d) {
      if (std::max(target.offsets[d], source.block.offsets[d]) >=
          std::min(target.offsets[d] + target.sizes[d], source.block.offsets[d] + source.block.sizes[d])) {
        return 0;
      }
    }
    if (target.flat() && source.block.flat() && target.offsets == source.block.offsets &&
        target.sizes == source.block.sizes &&
        (target.flat_end <= source.block.flat_begin || source.block.flat_end <= target.flat_begin)) {
      return 0;
    }
    File& f = file(source.file);
    readHeader(f);
    auto it = f.tensors.find(name);
    if (it == f.tensors.end()) {
      throw CheckpointError(detail::concat(f.path, ": no tensor \"", name, "\", which ", kCheckpointIndexFile,
                                           " places there: the file is damaged"));
    }
    const SafetensorsEntry& stored = it->second;
    const TensorBlock& s = source.block;
    const std::vector<int64_t> storedShape = s.flat() ? std::vector<int64_t>{s.numel()} : s.sizes;
    if (stored.dtype != safetensorsDtypeName(entry.dtype) || stored.shape != storedShape) {
      throw CheckpointError(detail::concat(f.path, ": tensor \"", name, "\" is ", stored.dtype, " of another shape than ",
                                           kCheckpointIndexFile, " says: the file is damaged"));
    }
    const size_t dims = entry.shape.size();
    const uint64_t item = static_cast<uint64_t>(c10::elementSize(entry.dtype));
    const uint64_t base = f.dataStart + stored.begin;
    const bool sameType = out.scalar_type() == entry.dtype;
    char* dstBase = static_cast<char*>(out.data_ptr());
    const int64_t outItem = static_cast<int64_t>(out.element_size());
    std::vector<char> staging;
    int64_t copied = 0;

    // A run of `count` elements: file element `src` -> out element `dst`.
    auto transfer = [&](int64_t src, int64_t dst, int64_t count) {
      copied += count;
      if (sameType) {
        readBytes(f, base + static_cast<uint64_t>(src) * item, static_cast<uint64_t>(count) * item,
                  dstBase + dst * outItem);
        return;
      }
      const int64_t piece = std::max<int64_t>(1, static_cast<int64_t>(kStagingBytes / item));
      for (int64_t done = 0; done < count; done += piece) {
        const int64_t n = std::min(piece, count - done);
        staging.resize(static_cast<size_t>(n) * item);
        readBytes(f, base + static_cast<uint64_t>(src + done) * item, static_cast<uint64_t>(n) * item, staging.data());
        at::Tensor from = at::from_blob(staging.data(), {n}, at::TensorOptions(entry.dtype));
        out.view({-1}).narrow(0, dst + done, n).copy_(from);
      }
    };

    if (dims == 0) {
      const bool inTarget = !target.flat() || (target.flat_begin <= 0 && 0 < target.flat_end);
      const bool inSource = !s.flat() || (s.flat_begin <= 0 && 0 < s.flat_end);
      if (inTarget && inSource) transfer(0, 0, 1);
      return copied;
    }
    std::vector<int64_t> lo(dims), hi(dims);
    for (size_t d = 0; d < dims; ++d) {
      lo[d] = std::max(target.offsets[d], s.offsets[d]);
      hi[d] = std::min(target.offsets[d] + target.sizes[d], s.offsets[d] + s.sizes[d]);
      if (lo[d] >= hi[d]) return 0;
    }
    auto strides = [&](const std::vector<int64_t>& sizes) {
      std::vector<int64_t> st(dims, 1);
      for (size_t d = dims - 1; d-- > 0;) st[d] = st[d + 1] * sizes[d + 1];
      return st;
    };
    const std::vector<int64_t> tStride = strides(target.sizes), sStride = strides(s.sizes);
    const size_t last = dims - 1;
    const int64_t length = hi[last] - lo[last];
    // Runs that continue each other in the file and in `out` are read as one.
    int64_t runSrc = -1, runDst = -1, runCount = 0;
    std::vector<int64_t> index(lo.begin(), lo.end());
    while (true) {
      int64_t tPos = lo[last] - target.offsets[last], sPos = lo[last] - s.offsets[last];
      for (size_t d = 0; d < last; ++d) {
        tPos += (index[d] - target.offsets[d]) * tStride[d];
        sPos += (index[d] - s.offsets[d]) * sStride[d];
      }
      int64_t j0 = 0, j1 = length;
      if (target.flat()) {
        j0 = std::max(j0, target.flat_begin - tPos);
        j1 = std::min(j1, target.flat_end - tPos);
      }
      if (s.flat()) {
        j0 = std::max(j0, s.flat_begin - sPos);
        j1 = std::min(j1, s.flat_end - sPos);
      }
      if (j0 < j1) {
        const int64_t dst = tPos + j0 - (target.flat() ? target.flat_begin : 0);
        const int64_t src = sPos + j0 - (s.flat() ? s.flat_begin : 0);
        if (runCount > 0 && runSrc + runCount == src && runDst + runCount == dst) {
          runCount += j1 - j0;
        } else {
          if (runCount > 0) transfer(runSrc, runDst, runCount);
          runSrc = src;
          runDst = dst;
          runCount = j1 - j0;
        }
      }
      // The next row of the intersection: an odometer over every dimension
      // but the last.
      int64_t d = static_cast<int64_t>(last) - 1;
      for (; d >= 0; --d) {
        const auto u = static_cast<size_t>(d);
        if (++index[u] < hi[u]) break;
        index[u] = lo[u];
      }
      if (d < 0) break;
    }
    if (runCount > 0) transfer(runSrc, runDst, runCount);
    return copied;
  }
};

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)), impl_(std::make_unique<Impl>()) {
  impl_->dir = dir_;
  const fs::path indexPath = fs::path(dir_) / kCheckpointIndexFile;
  if (!fs::exists(indexPath)) {
    const fs::path metaPath = fs::path(dir_) / "meta.json";
    if (!fs::exists(metaPath)) {
      throw CheckpointError(dir_ + ": not a checkpoint folder (no index.json or meta.json)");
    }
    // A sharded save's meta.json says so; without its index the shards
    // cannot be read (a consolidated folder has no index and no such mark).
    if (readJsonFile(metaPath.string()).value("format", "") == "ptrain.sharded") {
      throw CheckpointError(detail::concat(indexPath.string(), ": missing; the checkpoint's shards cannot be read without "
                                           "it: restore it, or resume from an earlier step (ptrain run --resume "
                                           "--from-step N)"));
    }
    return;  // whole-tensor files, read as asked
  }
  sharded_ = impl_->sharded = true;
  const std::string where = indexPath.string();
  const json index = readJsonFile(where);
  try {
    if (index.value("format", "") != kFormat || index.value("version", 0) != kVersion) {
      throw CheckpointError(detail::concat(where, ": not a ptrain sharded index of version ", kVersion,
                                           " (written by a newer ptrain?)"));
    }
    for (const auto& [name, record] : index.at("files").items()) {
      FileChecksum c;
      c.bytes = record.at("bytes").get<uint64_t>();
      c.block_bytes = record.at("block_bytes").get<uint64_t>();
      if (!parseHex32(record.at("crc32"), &c.crc32) || c.block_bytes == 0 ||
          record.at("block_crc32").size() != (c.bytes + c.block_bytes - 1) / c.block_bytes) {
        throw CheckpointError(detail::concat(where, ": the checksums of ", name, " are malformed"));
      }
      for (const auto& v : record.at("block_crc32")) {
        uint32_t crc = 0;
        if (!parseHex32(v, &crc)) throw CheckpointError(detail::concat(where, ": the checksums of ", name, " are malformed"));
        c.block_crc32.push_back(crc);
      }
      Impl::File f;
      f.path = (fs::path(dir_) / name).string();
      f.checksum = std::move(c);
      impl_->files.emplace(name, std::move(f));
    }
    for (const auto& [runtime, sections] : index.at("runtimes").items()) {
      for (const auto& [section, entries] : sections.items()) {
        auto& into = impl_->entries[runtime][section];
        for (const auto& [name, e] : entries.items()) {
          Impl::Entry entry;
          entry.dtype = dtypeOfName(e.at("dtype").get<std::string>(), where);
          entry.shape = e.at("shape").get<std::vector<int64_t>>();
          for (const auto& shard : e.at("shards")) {
            const std::string file = shard.at("file").get<std::string>();
            if (!impl_->files.count(file)) {
              throw CheckpointError(detail::concat(where, ": '", name, "' lies in ", file, ", which it lists no checksum of"));
            }
            entry.shards.push_back(Impl::ShardRef{file, blockFromJson(shard, entry.shape.size(), where + ": " + name)});
          }
          into[name] = std::move(entry);
        }
      }
    }
  } catch (const json::exception& e) {
    throw CheckpointError(detail::concat(where, ": malformed (", e.what(), ")"));
  }
}

CheckpointReader::CheckpointReader(std::string dir, std::string file)
    : dir_(std::move(dir)), impl_(std::make_unique<Impl>()) {
  impl_->dir = dir_;
  impl_->bareFile = std::move(file);
}

std::unique_ptr<CheckpointReader> CheckpointReader::openFile(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw CheckpointError(path + ": not found: give a .safetensors file, a Hugging Face model folder or a ptrain run or step folder");
  }
  fs::path p(path);
  std::unique_ptr<CheckpointReader> reader(
      new CheckpointReader(p.has_parent_path() ? p.parent_path().string() : ".", p.filename().string()));
  // The header now, so a file that is not safetensors fails here, in one line.
  reader->impl_->readHeader(reader->impl_->file(reader->impl_->bareFile));
  return reader;
}

CheckpointReader::~CheckpointReader() = default;

bool CheckpointReader::hasRuntime(const std::string& runtime) const {
  if (sharded_) return impl_->entries.count(runtime) != 0;
  if (!impl_->bareFile.empty()) return true;
  return fs::exists(fs::path(dir_) / wholeFile(runtime, CheckpointSection::kParameters));
}

std::optional<CheckpointReader::TensorInfo> CheckpointReader::find(const std::string& runtime,
                                                                   CheckpointSection section,
                                                                   const std::string& name) {
  const auto& entries = impl_->sectionEntries(runtime, section);
  auto it = entries.find(name);
  if (it == entries.end()) return std::nullopt;
  return TensorInfo{it->second.dtype, it->second.shape};
}

std::vector<std::string> CheckpointReader::names(const std::string& runtime, CheckpointSection section) {
  std::vector<std::string> out;
  for (const auto& [name, entry] : impl_->sectionEntries(runtime, section)) out.push_back(name);
  return out;
}

void CheckpointReader::read(const std::string& runtime, CheckpointSection section, const std::string& name,
                            const TensorBlock& block, at::Tensor& out) {
  const auto& entries = impl_->sectionEntries(runtime, section);
  auto it = entries.find(name);
  if (it == entries.end()) {
    throw CheckpointError(detail::concat(dir_, ": no ", sectionKey(section), " tensor '", name, "' of '", runtime,
                                         "': the checkpoint is from another model"));
  }
  const Impl::Entry& entry = it->second;
  const size_t dims = entry.shape.size();
  bool inside = block.offsets.size() == dims && block.sizes.size() == dims;
  for (size_t d = 0; inside && d < dims; ++d) {
    inside = block.offsets[d] >= 0 && block.sizes[d] >= 0 && block.offsets[d] + block.sizes[d] <= entry.shape[d];
  }
  if (!inside) {
    throw CheckpointError(detail::concat(dir_, ": '", name, "' of '", runtime, "' has shape ",
                                         c10::IntArrayRef(entry.shape), ", which holds no block of sizes ",
                                         c10::IntArrayRef(block.sizes), ": the checkpoint is from another model"));
  }
  PTRAIN_CHECK(out.numel() == block.numel(), "CheckpointReader::read: '", name, "': ", out.numel(),
               " elements for a block of ", block.numel());
  // Filled on the host in out's dtype, then moved where out lives.
  at::Tensor host = out.is_cpu() && out.is_contiguous() ? out : at::empty(out.sizes(), out.options().device(at::kCPU));
  int64_t filled = 0;
  for (const Impl::ShardRef& shard : entry.shards) filled += impl_->copyIntersection(name, entry, shard, block, host);
  if (filled != block.numel()) {
    throw CheckpointError(detail::concat(dir_, ": '", name, "' of '", runtime, "': the saved shards hold ", filled,
                                         " of the ", block.numel(), " elements asked for: the checkpoint is incomplete"));
  }
  if (!host.is_same(out)) out.copy_(host);
}

at::Tensor CheckpointReader::readWhole(const std::string& runtime, CheckpointSection section, const std::string& name) {
  auto info = find(runtime, section, name);
  if (!info) {
    throw CheckpointError(detail::concat(dir_, ": no ", sectionKey(section), " tensor '", name, "' of '", runtime, "'"));
  }
  at::Tensor out = at::empty(info->shape, at::TensorOptions(info->dtype));
  read(runtime, section, name, TensorBlock::whole(info->shape), out);
  return out;
}

uint64_t CheckpointReader::bytesRead() const { return impl_->bytesRead; }

std::vector<std::string> allGatherStrings(ProcessGroup& group, const std::string& text, at::Device device) {
  if (group.size() == 1) return {text};
  const auto i64 = at::TensorOptions(at::kLong).device(device);
  at::Tensor length = at::tensor({static_cast<int64_t>(text.size())}, at::TensorOptions(at::kLong)).to(device);
  at::Tensor lengths = at::empty({group.size()}, i64);
  group.allgather(lengths, length)->wait();
  const std::vector<int64_t> each(lengths.cpu().data_ptr<int64_t>(), lengths.cpu().data_ptr<int64_t>() + group.size());
  const int64_t longest = std::max<int64_t>(1, *std::max_element(each.begin(), each.end()));
  at::Tensor mine = at::zeros({longest}, at::TensorOptions(at::kByte));
  std::memcpy(mine.data_ptr<uint8_t>(), text.data(), text.size());
  at::Tensor all = at::empty({longest * group.size()}, at::TensorOptions(at::kByte).device(device));
  group.allgather(all, mine.to(device))->wait();
  const at::Tensor host = all.cpu();
  std::vector<std::string> out;
  for (int r = 0; r < group.size(); ++r) {
    const char* begin = reinterpret_cast<const char*>(host.data_ptr<uint8_t>()) + r * longest;
    out.emplace_back(begin, static_cast<size_t>(each[static_cast<size_t>(r)]));
  }
  return out;
}

void agreeOnFailure(ProcessGroup& world, at::Device device, const std::string& error, const std::string& what) {
  // The lowest failing rank + 1, or 0: one reduction tells everyone who.
  const int64_t mine = error.empty() ? 0 : world.size() - world.rank();
  at::Tensor flag = at::tensor({mine}, at::TensorOptions(at::kLong)).to(device);
  if (world.size() > 1) {
    AllreduceOptions max;
    max.op = ReduceOp::kMax;
    world.allreduce(flag, max)->wait();
  }
  const int64_t worst = flag.cpu().item<int64_t>();
  if (worst == 0) return;
  if (!error.empty()) throw CheckpointError(error);
  throw PeerFailedError(detail::concat(what, ": stopped, because rank ", world.size() - worst, " failed (its own line says why)"));
}

namespace {

// Whether every element of `t` is finite, a slab of rows at a time: the test's
// own bool tensor stays small whatever the size of the shard.
bool allFinite(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !t.is_floating_point()) return true;
  if (t.dim() == 0) return t.isfinite().item<bool>();
  constexpr int64_t kElements = int64_t{1} << 20;
  const int64_t rowElements = std::max<int64_t>(1, t.numel() / t.size(0));
  const int64_t rows = std::max<int64_t>(1, kElements / rowElements);
  for (int64_t first = 0; first < t.size(0); first += rows) {
    if (!t.narrow(0, first, std::min(rows, t.size(0) - first)).isfinite().all().item<bool>()) return false;
  }
  return true;
}

}  // namespace

uint64_t writeShardedCheckpoint(const std::string& dir, int64_t step, const std::vector<ModelRuntime*>& runtimes,
                                ProcessGroup& world) {
  PTRAIN_CHECK(!runtimes.empty(), "writeShardedCheckpoint: no runtime");
  const at::Device device = runtimes.front()->device();
  const int rank = world.rank();
  uint64_t bytes = 0;
  json part{{"files", json::object()}, {"runtimes", json::object()}};
  std::string error;
  // No checkpoint holds a non-finite parameter: a run that diverged keeps its
  // last good step as the newest (train.on_nonfinite). Every rank checks its
  // own share; all learn of it together.
  std::vector<RankShare> shares;
  std::string nonFinite;
  for (ModelRuntime* runtime : runtimes) {
    shares.push_back(runtime->checkpointShare());
    for (const ShardedTensor& t : shares.back().parameters) {
      if (nonFinite.empty() && !allFinite(t.local)) nonFinite = runtime->name() + "'s " + t.name;
    }
  }
  at::Tensor flag = torch::tensor({nonFinite.empty() ? 0.0f : 1.0f}, torch::kFloat32).to(device);
  if (world.size() > 1) {
    AllreduceOptions max;
    max.op = ReduceOp::kMax;
    world.allreduce(flag, max)->wait();
  }
  if (flag.cpu().item<float>() > 0) {
    throw NonFiniteError(detail::concat(
        "step ", step, ": not saved: ",
        nonFinite.empty() ? "another rank's parameters hold" : "parameter " + nonFinite + " holds",
        " NaN or inf values (the run diverged); the newest checkpoint is still the last good one: lower optimizer.lr "
        "or resume from an earlier step (ptrain run --resume --from-step N)"));
  }
  try {
    for (size_t i = 0; i < runtimes.size(); ++i) {
      ModelRuntime* runtime = runtimes[i];
      const json mine = writeRankShare(dir, runtime->name(), rank, shares[i]);
      for (const auto& [file, record] : mine["files"].items()) {
        syncFile((fs::path(dir) / file).string());
        bytes += record.at("bytes").get<uint64_t>();
        part["files"][file] = record;
      }
      for (const auto& [name, sections] : mine["runtimes"].items()) part["runtimes"][name] = sections;
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agreeOnFailure(world, device, error, dir);
  const std::vector<std::string> parts = allGatherStrings(world, part.dump(), device);
  if (rank == 0) {
    try {
      std::vector<json> parsed;
      for (const auto& text : parts) parsed.push_back(json::parse(text));
      writeJsonFile((fs::path(dir) / kCheckpointIndexFile).string(), mergeIndexParts(parsed, step));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agreeOnFailure(world, device, error, dir);
  return bytes;
}

void consolidateCheckpoint(const std::string& stepDir, const std::string& outDir) {
  CheckpointReader reader(stepDir);
  json meta = readJsonFile((fs::path(stepDir) / "meta.json").string());
  std::vector<std::string> runtimes;
  if (meta.contains("runtimes") && meta["runtimes"].is_object()) {
    for (const auto& [name, value] : meta["runtimes"].items()) runtimes.push_back(name);
  } else {
    runtimes.push_back("model");
  }
  for (const std::string& runtime : runtimes) {
    if (!reader.hasRuntime(runtime)) {
      throw CheckpointError(detail::concat(stepDir, ": meta.json names model '", runtime, "', which it holds no tensors of"));
    }
  }
  // A damaged shard found half-way leaves no output folder behind.
  writeNewFolder(outDir, [&](const std::string& tmp) {
    for (const std::string& runtime : runtimes) {
      for (CheckpointSection section : {CheckpointSection::kParameters, CheckpointSection::kOptimizer}) {
        std::vector<SafetensorsTensorSpec> specs;
        for (const std::string& name : reader.names(runtime, section)) {
          auto info = reader.find(runtime, section, name);
          specs.push_back(SafetensorsTensorSpec{name, info->dtype, info->shape});
        }
        SafetensorsWriter writer((fs::path(tmp) / wholeFile(runtime, section)).string(), specs, {{"format", "pt"}});
        // One tensor in memory at a time, in the order the writer lays them out.
        for (const auto& spec : writer.order()) writer.append(reader.readWhole(runtime, section, spec.name));
        writer.finish();
      }
    }
    meta.erase("format");
    writeJsonFile((fs::path(tmp) / "meta.json").string(), meta);
  });
}

}  // namespace ptrain

#include "ptrain/engine/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

// The format stores little-endian bytes and we copy tensor memory as is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace ptrain {

namespace {

using nlohmann::json;

constexpr const char* kMetadataKey = "__metadata__";

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  uint64_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2}, {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},   {"I32", at::kInt, 4},   {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},    {"BOOL", at::kBool, 1},
};

const DtypeInfo* dtypeByName(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const DtypeInfo* dtypeByType(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (type == d.type) return &d;
  }
  return nullptr;
}

std::string supportedDtypes() {
  std::string out;
  for (const auto& d : kDtypes) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// Closes the descriptor on every path out, so an exception never leaks it.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd& operator=(Fd&&) = delete;
  int get() const { return fd_; }
  // Returns close()'s result: on some filesystems (NFS) a failed write shows
  // up only here.
  int release() {
    int r = ::close(fd_);
    fd_ = -1;
    return r;
  }

 private:
  int fd_;
};

void writeAll(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(detail::concat(path, ": write failed (", std::strerror(errno), ")"));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

// Reads exactly `size` bytes at `offset`; the caller has checked that the file
// is long enough, so a short read means the file changed underneath us.
void readAt(int fd, void* data, size_t size, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(detail::concat(path, ": read failed (", std::strerror(errno), ")"));
    }
    if (n == 0) {
      throw CheckpointError(detail::concat(path, ": file ended early at byte ", offset,
                                           " (was it modified while being read?)"));
    }
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

Fd openForRead(const std::string& path, uint64_t* fileSize) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw CheckpointError(detail::concat(path, ": file not found"));
    throw CheckpointError(detail::concat(path, ": cannot open (", std::strerror(errno), ")"));
  }
  Fd file(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw CheckpointError(detail::concat(path, ": cannot stat (", std::strerror(errno), ")"));
  }
  if (!S_ISREG(st.st_mode)) throw CheckpointError(detail::concat(path, ": not a regular file"));
  *fileSize = static_cast<uint64_t>(st.st_size);
  return file;
}

// A non-negative JSON integer, or false.
bool toUnsigned(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

struct Header {
  std::vector<SafetensorsEntry> entries;  // ascending data offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;                 // file offset of the first data byte
};

Header parseHeader(int fd, uint64_t fileSize, const std::string& path) {
  auto fail = [&](auto&&... parts) {
    throw CheckpointError(detail::concat(path, ": ", std::forward<decltype(parts)>(parts)...));
  };
  if (fileSize < 8) {
    fail("file is ", fileSize, " bytes, too short for the 8-byte header length (truncated or not a safetensors file)");
  }
  unsigned char lenBytes[8];
  readAt(fd, lenBytes, 8, 0, path);
  uint64_t headerLen = 0;
  for (int i = 7; i >= 0; --i) headerLen = (headerLen << 8) | lenBytes[i];
  if (headerLen > fileSize - 8) {
    fail("header length ", headerLen, " is larger than the ", fileSize - 8,
         " bytes that follow it (truncated or not a safetensors file)");
  }
  std::string text(headerLen, '\0');
  if (headerLen > 0) readAt(fd, text.data(), headerLen, 8, path);
  if (text.empty() || text[0] != '{') fail("header does not start with '{' (not a safetensors file)");

  // nlohmann keeps the last of duplicate keys silently; a duplicated tensor
  // name would hide a tensor, so catch it while parsing.
  std::string duplicate;
  std::set<std::string> seen;
  auto onEvent = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, onEvent);
  } catch (const json::exception& e) {
    fail("header is not valid JSON (", e.what(), ")");
  }
  if (!duplicate.empty()) fail("header names \"", duplicate, "\" twice");
  if (!header.is_object()) fail("header is not a JSON object");

  Header out;
  out.data_start = 8 + headerLen;
  const uint64_t dataSize = fileSize - out.data_start;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) fail("\"__metadata__\" is not a JSON object");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string()) fail("\"__metadata__\" value of \"", key, "\" is not a string");
        out.metadata[key] = v.get<std::string>();
      }
      continue;
    }
    if (!value.is_object()) fail("tensor \"", name, "\": entry is not a JSON object");
    SafetensorsEntry entry;
    entry.name = name;
    auto dtypeIt = value.find("dtype");
    if (dtypeIt == value.end() || !dtypeIt->is_string()) fail("tensor \"", name, "\": \"dtype\" missing or not a string");
    entry.dtype = dtypeIt->get<std::string>();
    const DtypeInfo* dtype = dtypeByName(entry.dtype);
    if (dtype == nullptr) {
      fail("tensor \"", name, "\": unknown dtype \"", entry.dtype, "\" (supported: ", supportedDtypes(), ")");
    }
    auto shapeIt = value.find("shape");
    bool shapeOk = shapeIt != value.end() && shapeIt->is_array();
    uint64_t bytes = dtype->size;
    if (shapeOk) {
      for (const auto& d : *shapeIt) {
        uint64_t dim = 0;
        if (!toUnsigned(d, &dim) || dim > static_cast<uint64_t>(INT64_MAX)) {
          shapeOk = false;
          break;
        }
        entry.shape.push_back(static_cast<int64_t>(dim));
        if (__builtin_mul_overflow(bytes, dim, &bytes)) {
          fail("tensor \"", name, "\": shape ", shapeIt->dump(), " is too large");
        }
      }
    }
    if (!shapeOk) fail("tensor \"", name, "\": \"shape\" missing or not a list of non-negative integers");
    auto offIt = value.find("data_offsets");
    if (offIt == value.end() || !offIt->is_array() || offIt->size() != 2 || !toUnsigned((*offIt)[0], &entry.begin) ||
        !toUnsigned((*offIt)[1], &entry.end)) {
      fail("tensor \"", name, "\": \"data_offsets\" missing or not two non-negative integers [begin, end]");
    }
    if (entry.end < entry.begin) {
      fail("tensor \"", name, "\": data_offsets [", entry.begin, ", ", entry.end, "] end before they begin");
    }
    if (entry.end - entry.begin != bytes) {
      fail("tensor \"", name, "\": data_offsets [", entry.begin, ", ", entry.end, "] hold ", entry.end - entry.begin,
           " bytes, but shape ", shapeText(entry.shape), " of ", entry.dtype, " needs ", bytes);
    }
    if (entry.end > dataSize) {
      fail("tensor \"", name, "\": data_offsets [", entry.begin, ", ", entry.end, "] run past the end of the ",
           dataSize, "-byte data section (truncated file?)");
    }
    out.entries.push_back(std::move(entry));
  }

  // Like the reference reader: the tensors tile the data section exactly,
  // so no byte is shared by two tensors or belongs to none.
  std::sort(out.entries.begin(), out.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const auto& e : out.entries) {
    if (e.begin < cursor) {
      fail("tensors \"", previous->name, "\" and \"", e.name, "\" overlap (data_offsets [", previous->begin, ", ",
           previous->end, "] and [", e.begin, ", ", e.end, "])");
    }
    if (e.begin > cursor) fail("data bytes [", cursor, ", ", e.begin, ") belong to no tensor");
    cursor = e.end;
    if (e.end > e.begin) previous = &e;
  }
  if (cursor != dataSize) fail("data bytes [", cursor, ", ", dataSize, ") belong to no tensor");
  return out;
}

}  // namespace

SafetensorsFile::SafetensorsFile() = default;
SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::SafetensorsFile(const SafetensorsFile&) = default;
SafetensorsFile& SafetensorsFile::operator=(const SafetensorsFile&) = default;

const at::Tensor& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    throw CheckpointError(
        detail::concat(path, ": no tensor \"", name, "\" (the file holds ", tensors.size(), " tensors)"));
  }
  return it->second;
}

std::string safetensorsDtypeName(at::ScalarType type) {
  const DtypeInfo* d = dtypeByType(type);
  if (d == nullptr) {
    throw CheckpointError(detail::concat("dtype ", c10::toString(type),
                                         " cannot be stored in a safetensors file (supported: ", supportedDtypes(),
                                         ")"));
  }
  return d->name;
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<SafetensorsTensorSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), specs_(std::move(specs)) {
  auto fail = [&](auto&&... parts) {
    throw CheckpointError(detail::concat(path_, ": ", std::forward<decltype(parts)>(parts)...));
  };
  // Sorted by name so that the same state always gives the same bytes.
  std::stable_sort(specs_.begin(), specs_.end(),
                   [](const SafetensorsTensorSpec& a, const SafetensorsTensorSpec& b) { return a.name < b.name; });
  json header = json::object();
  uint64_t offset = 0;
  for (size_t k = 0; k < specs_.size(); ++k) {
    const SafetensorsTensorSpec& spec = specs_[k];
    if (spec.name.empty()) fail("a tensor has an empty name");
    if (spec.name == kMetadataKey) fail("\"__metadata__\" is reserved and cannot name a tensor");
    if (k > 0 && specs_[k - 1].name == spec.name) fail("tensor name \"", spec.name, "\" appears twice");
    const DtypeInfo* d = dtypeByType(spec.dtype);
    if (d == nullptr) {
      fail("tensor \"", spec.name, "\" has dtype ", c10::toString(spec.dtype),
           ", which safetensors cannot hold (supported: ", supportedDtypes(), ")");
    }
    uint64_t bytes = d->size;
    for (int64_t dim : spec.shape) bytes *= static_cast<uint64_t>(dim);
    header[spec.name] = {{"dtype", d->name}, {"shape", spec.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;

  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    fail("a tensor name or metadata entry is not valid UTF-8 (", e.what(), ")");
  }
  // Pad so the data starts 8-byte aligned: the 8-byte length plus the header.
  text.append((8 - text.size() % 8) % 8, ' ');

  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create (", std::strerror(errno), ")");
  checksum_.block_bytes = kChecksumBlockBytes;
  unsigned char lenBytes[8];
  const uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) lenBytes[i] = static_cast<unsigned char>((len >> (8 * i)) & 0xff);
  write(lenBytes, 8);
  write(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write(const void* data, size_t size) {
  writeAll(fd_, data, size, path_);
  // The checksums follow the bytes as they go out, block by block.
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(size, checksum_.block_bytes - blockFill_));
    blockCrc_ = static_cast<uint32_t>(crc32_z(blockCrc_, p, take));
    checksum_.crc32 = static_cast<uint32_t>(crc32_z(checksum_.crc32, p, take));
    blockFill_ += take;
    checksum_.bytes += take;
    p += take;
    size -= take;
    if (blockFill_ == checksum_.block_bytes) {
      checksum_.block_crc32.push_back(blockCrc_);
      blockCrc_ = 0;
      blockFill_ = 0;
    }
  }
}

void SafetensorsWriter::append(const at::Tensor& tensor) {
  auto fail = [&](auto&&... parts) {
    throw CheckpointError(detail::concat(path_, ": ", std::forward<decltype(parts)>(parts)...));
  };
  if (next_ >= specs_.size()) fail("more tensors appended than the header names");
  const SafetensorsTensorSpec& spec = specs_[next_++];
  if (!tensor.defined()) fail("tensor \"", spec.name, "\" is undefined");
  if (tensor.layout() != at::kStrided) fail("tensor \"", spec.name, "\" is not dense (layout ", tensor.layout(), ")");
  if (tensor.scalar_type() != spec.dtype || tensor.sizes().vec() != spec.shape) {
    fail("tensor \"", spec.name, "\" is not the ", c10::toString(spec.dtype), " tensor of the header's shape");
  }
  if (tensor.numel() == 0) return;
  // One tensor at a time: a device tensor is copied to host only while it
  // is being written.
  at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
  write(cpu.data_ptr(), cpu.nbytes());
}

FileChecksum SafetensorsWriter::finish() {
  if (next_ != specs_.size()) {
    throw CheckpointError(detail::concat(path_, ": ", specs_.size() - next_, " tensors of the header never written"));
  }
  if (blockFill_ > 0) checksum_.block_crc32.push_back(blockCrc_);
  blockFill_ = 0;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw CheckpointError(detail::concat(path_, ": write failed (", std::strerror(errno), ")"));
  return checksum_;
}

void saveSafetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                     const std::map<std::string, std::string>& metadata, FileChecksum* checksum) {
  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) throw CheckpointError(detail::concat(path, ": tensor \"", name, "\" is undefined"));
    specs.push_back(SafetensorsTensorSpec{name, t.scalar_type(), t.sizes().vec()});
  }
  SafetensorsWriter writer(path, specs, metadata);
  std::map<std::string, const at::Tensor*> byName;
  for (const auto& [name, t] : tensors) byName.emplace(name, &t);
  for (const auto& spec : writer.order()) writer.append(*byName.at(spec.name));
  FileChecksum sum = writer.finish();
  if (checksum != nullptr) *checksum = std::move(sum);
}

std::vector<SafetensorsEntry> readSafetensorsHeader(const std::string& path,
                                                    std::map<std::string, std::string>* metadata,
                                                    uint64_t* dataStart) {
  uint64_t size = 0;
  Fd file = openForRead(path, &size);
  Header header = parseHeader(file.get(), size, path);
  if (metadata != nullptr) *metadata = std::move(header.metadata);
  if (dataStart != nullptr) *dataStart = header.data_start;
  return std::move(header.entries);
}

SafetensorsFile loadSafetensors(const std::string& path) {
  uint64_t size = 0;
  Fd file = openForRead(path, &size);
  Header header = parseHeader(file.get(), size, path);
  SafetensorsFile out;
  out.path = path;
  out.metadata = std::move(header.metadata);
  for (const auto& e : header.entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(dtypeByName(e.dtype)->type));
    if (e.end > e.begin) readAt(file.get(), t.data_ptr(), e.end - e.begin, header.data_start + e.begin, path);
    if (t.scalar_type() == at::kBool) {
      // A bool byte other than 0 or 1 is undefined behaviour in every kernel
      // that reads it; refuse it here rather than compute garbage later.
      const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (bytes[i] > 1) {
          throw CheckpointError(detail::concat(path, ": tensor \"", e.name, "\": BOOL element ", i, " is byte ",
                                               static_cast<int>(bytes[i]), " (only 0 and 1 are valid)"));
        }
      }
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace ptrain

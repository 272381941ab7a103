#include "ptrain/datasets/criteo_dataset.h"

#include "ptrain/core/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace fs = std::filesystem;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the .ptrain-index format is little-endian and is read without byte swapping");

namespace ptrain::datasets {
namespace {

constexpr char kIndexMagic[8] = {'P', 'T', 'R', 'C', 'R', 'I', 'D', 'X'};
constexpr size_t kHeaderBytes = 80;
constexpr size_t kPointBytes = 32;
constexpr size_t kWindow = static_cast<size_t>(kCriteoWindowBytes);
// Read size of the index scan: large enough that syscalls do not matter.
constexpr size_t kScanChunk = size_t{1} << 20;
// Compressed bytes taken per pread when decompressing a run: small, so a short
// run past an access point reads little more than it needs.
constexpr size_t kExtractChunk = size_t{64} << 10;
constexpr size_t kInflateOut = size_t{256} << 10;
// A gzip member's trailer (CRC-32 and size), which raw inflate leaves unread.
constexpr unsigned kGzipTrailer = 8;

struct FileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

FileStamp stampOf(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {};
  return {static_cast<uint64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

std::string errnoText(int e) { return std::strerror(e); }

// A field quoted in a message: short and without control characters, so the
// error stays one line however damaged the data.
std::string shown(const char* b, const char* e) {
  std::string out = "\"";
  const size_t n = static_cast<size_t>(e - b);
  for (size_t i = 0; i < n && i < 24; ++i) {
    const unsigned char c = static_cast<unsigned char>(b[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static const char* kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (n > 24) out += "...";
  return out + "\"";
}

// The whole of [offset, offset + length) or an error: pread may return less
// than asked (signals, very large reads).
bool preadFull(int fd, void* out, uint64_t offset, uint64_t length, int* error) {
  auto* p = static_cast<char*>(out);
  while (length > 0) {
    const ssize_t got =
        ::pread(fd, p, static_cast<size_t>(std::min<uint64_t>(length, 1u << 30)), static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      *error = errno;
      return false;
    }
    if (got == 0) {
      *error = 0;  // end of file
      return false;
    }
    p += got;
    offset += static_cast<uint64_t>(got);
    length -= static_cast<uint64_t>(got);
  }
  return true;
}

bool writeFull(int fd, const void* data, size_t length) {
  const auto* p = static_cast<const char*>(data);
  while (length > 0) {
    const ssize_t put = ::write(fd, p, length);
    if (put < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += put;
    length -= static_cast<size_t>(put);
  }
  return true;
}

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

constexpr const char* kColumnsHelp =
    "a Criteo record has 40 tab-separated columns (label, 13 integer and 26 categorical features), or 40 + H "
    "with H history items";

// Finds line starts and checks every line's column count while the text
// streams by, once, whichever way it is stored.
class LineScanner {
 public:
  explicit LineScanner(const std::string& path) : path_(path) {}

  void feed(const unsigned char* data, size_t n) {
    size_t i = 0;
    while (i < n) {
      if (!inLine_) {
        starts_.push_back(pos_ + i);
        inLine_ = true;
        tabs_ = 0;
        lineBytes_ = 0;
      }
      const auto* nl = static_cast<const unsigned char*>(std::memchr(data + i, '\n', n - i));
      const size_t stop = nl ? static_cast<size_t>(nl - data) : n;
      tabs_ += std::count(data + i, data + stop, '\t');
      lineBytes_ += stop - i;
      lastByte_ = stop > i ? data[stop - 1] : lastByte_;
      if (!nl) {
        i = n;
        break;
      }
      endLine();
      i = stop + 1;
    }
    pos_ += n;
  }

  // After the last byte: a last line without "\n" is a record too.
  void finish() {
    if (inLine_) endLine();
    starts_.push_back(pos_);
  }

  // Records starting before the bytes fed so far: at an access point, the
  // number of the first record at or after it.
  uint64_t recordsStarted() const { return starts_.size(); }
  int64_t columns() const { return columns_; }
  std::vector<uint64_t>& starts() { return starts_; }

 private:
  void endLine() {
    inLine_ = false;
    const int64_t line = static_cast<int64_t>(starts_.size());
    const int64_t columns = tabs_ + 1;
    const bool blank = lineBytes_ == 0 || (lineBytes_ == 1 && lastByte_ == '\r');
    if (blank) {
      throw ConfigError(detail::concat(path_, ":", line, ": an empty line; every line is a record (", kColumnsHelp,
                                       "): remove the blank line"));
    }
    if (columns_ < 0) {
      if (columns < kCriteoBaseColumns) {
        throw ConfigError(detail::concat(
            path_, ":", line, ": ", columns, " column", columns == 1 ? "" : "s", "; ", kColumnsHelp,
            columns == kCriteoBaseColumns - 1 ? " (Criteo's test.txt has no label column and cannot be read)"
                                              : " (is the file tab-separated?)"));
      }
      if (columns > kCriteoBaseColumns + kCriteoMaxHistory) {
        throw ConfigError(detail::concat(path_, ":", line, ": ", columns, " columns give ",
                                         columns - kCriteoBaseColumns, " history slots, more than ", kCriteoMaxHistory,
                                         "; ", kColumnsHelp, ", H <= ", kCriteoMaxHistory));
      }
      columns_ = columns;
    } else if (columns != columns_) {
      throw ConfigError(detail::concat(path_, ":", line, ": ", columns, " columns where line 1 has ", columns_,
                                       "; every line of a file needs the same columns (a truncated or joined line?)"));
    }
  }

  const std::string& path_;
  std::vector<uint64_t> starts_;
  uint64_t pos_ = 0;
  bool inLine_ = false;
  int64_t tabs_ = 0;
  uint64_t lineBytes_ = 0;
  unsigned char lastByte_ = 0;
  int64_t columns_ = -1;
};

struct AccessPoint {
  uint64_t in = 0;            // compressed offset of the first byte inflate needs whole
  uint64_t out = 0;           // text offset the point starts at
  uint64_t first_record = 0;  // the first record starting at or after `out`
  uint32_t bits = 0;          // bits of the byte before `in` still to decode (0-7)
};

}  // namespace

struct CriteoDataset::Index {
  bool gzip = false;
  FileStamp data;
  uint64_t text_size = 0;
  uint64_t records = 0;
  int64_t columns = 0;
  uint64_t span = 0;
  std::vector<AccessPoint> points;
  // In memory (just built, or no folder could take it) ...
  std::vector<uint64_t> offsets;
  std::vector<unsigned char> windows;
  // ... or read from the index file on demand.
  int fd = -1;
  uint64_t windowsAt = 0;
  uint64_t offsetsAt = 0;
  CriteoIndexInfo info;

  Index() = default;
  Index(const Index&) = delete;
  Index& operator=(const Index&) = delete;
  ~Index() {
    if (fd >= 0) ::close(fd);
  }

  // offsets[first .. first + n).
  void readOffsets(uint64_t first, uint64_t n, uint64_t* out, std::atomic<uint64_t>& counter) const {
    if (fd < 0) {
      std::memcpy(out, offsets.data() + first, n * sizeof(uint64_t));
      return;
    }
    int error = 0;
    if (!preadFull(fd, out, offsetsAt + first * sizeof(uint64_t), n * sizeof(uint64_t), &error)) {
      throw ConfigError(detail::concat(info.path, ": cannot read the index (",
                                       error ? errnoText(error) : "it is truncated",
                                       "); delete it and open the data again to rebuild it"));
    }
    counter += n * sizeof(uint64_t);
  }

  void readWindow(size_t k, unsigned char* out, std::atomic<uint64_t>& counter) const {
    if (fd < 0) {
      std::memcpy(out, windows.data() + k * kWindow, kWindow);
      return;
    }
    int error = 0;
    if (!preadFull(fd, out, windowsAt + k * kWindow, kWindow, &error)) {
      throw ConfigError(detail::concat(info.path, ": cannot read the index (",
                                       error ? errnoText(error) : "it is truncated",
                                       "); delete it and open the data again to rebuild it"));
    }
    counter += kWindow;
  }
};

namespace {

using Index = CriteoDataset::Index;

void putU32(unsigned char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void putU64(unsigned char* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t getU32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t getU64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// The header and access point table: the part of the index kept in memory,
// and the part the CRC covers (the offsets and windows are checked against
// the data as they are used).
std::vector<unsigned char> encodeHead(const Index& index) {
  std::vector<unsigned char> head(kHeaderBytes + index.points.size() * kPointBytes, 0);
  unsigned char* h = head.data();
  std::memcpy(h, kIndexMagic, 8);
  putU32(h + 8, kCriteoIndexVersion);
  putU32(h + 12, index.gzip ? 1 : 0);
  putU64(h + 16, index.data.size);
  putU64(h + 24, static_cast<uint64_t>(index.data.mtime_ns));
  putU64(h + 32, index.text_size);
  putU64(h + 40, index.records);
  putU32(h + 48, static_cast<uint32_t>(index.columns));
  putU32(h + 52, static_cast<uint32_t>(kWindow));
  putU64(h + 56, index.span);
  putU64(h + 64, index.points.size());
  for (size_t k = 0; k < index.points.size(); ++k) {
    unsigned char* p = h + kHeaderBytes + k * kPointBytes;
    putU64(p, index.points[k].in);
    putU64(p + 8, index.points[k].out);
    putU64(p + 16, index.points[k].first_record);
    putU32(p + 24, index.points[k].bits);
  }
  putU32(h + 72, static_cast<uint32_t>(crc32(0L, head.data(), static_cast<uInt>(head.size()))));
  return head;
}

// Writes `index` to `target` through a temp file in the same folder; "" or
// why it could not (the caller then keeps the index in memory).
std::string writeIndexFile(const Index& index, const fs::path& target) {
  static std::atomic<uint64_t> counter{0};
  const std::string temp = detail::concat(target.string(), ".tmp.", ::getpid(), ".", counter++);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return detail::concat("cannot create ", temp, ": ", errnoText(errno));
  const std::vector<unsigned char> head = encodeHead(index);
  bool ok = writeFull(fd, head.data(), head.size()) && writeFull(fd, index.windows.data(), index.windows.size()) &&
            writeFull(fd, index.offsets.data(), index.offsets.size() * sizeof(uint64_t));
  int error = ok ? 0 : errno;
  if (ok && ::fsync(fd) != 0) {
    ok = false;
    error = errno;
  }
  ::close(fd);
  if (ok && ::rename(temp.c_str(), target.c_str()) != 0) {
    ok = false;
    error = errno;
  }
  if (!ok) {
    ::unlink(temp.c_str());
    return detail::concat("cannot write ", target.string(), ": ", errnoText(error));
  }
  return "";
}

enum class LoadResult { kLoaded, kMissing, kStale, kForeign };

// Opens the index file at `path` for the data `stamp` describes. kStale with
// `why` for one that must be rebuilt; kForeign for a file that is not a ptrain
// index, which is not ours to overwrite.
LoadResult loadIndexFile(const std::string& path, const FileStamp& stamp, bool gzip, Index& index, std::string& why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return LoadResult::kMissing;
    why = detail::concat("cannot read ", path, ": ", errnoText(errno));
    return LoadResult::kStale;
  }
  auto stale = [&](std::string reason) {
    ::close(fd);
    why = path + ": " + reason;
    return LoadResult::kStale;
  };
  const FileStamp own = stampOf(fd);
  unsigned char h[kHeaderBytes] = {};
  int error = 0;
  const bool whole = preadFull(fd, h, 0, kHeaderBytes, &error);
  if (own.size < 8 || std::memcmp(h, kIndexMagic, 8) != 0) {
    ::close(fd);
    return LoadResult::kForeign;
  }
  if (!whole) return stale("truncated header");
  const uint32_t version = getU32(h + 8);
  if (version != kCriteoIndexVersion) {
    return stale(detail::concat("index version ", version, ", this ptrain reads version ", kCriteoIndexVersion));
  }
  if ((getU32(h + 12) == 1) != gzip)
    return stale("built for a file of another compression (the data file was replaced)");
  const uint64_t size = getU64(h + 16);
  const auto mtime = static_cast<int64_t>(getU64(h + 24));
  if (size != stamp.size || mtime != stamp.mtime_ns) {
    return stale(detail::concat("built for a data file of ", size, " bytes and mtime ", mtime, " ns; it now has ",
                                stamp.size, " bytes and mtime ", stamp.mtime_ns, " ns (the data file changed)"));
  }
  const uint64_t records = getU64(h + 40);
  const uint64_t points = getU64(h + 64);
  const auto columns = static_cast<int64_t>(getU32(h + 48));
  if (getU32(h + 52) != kWindow || points > own.size / kWindow + 1 || records > own.size / 8 ||
      (records > 0 && (columns < kCriteoBaseColumns || columns > kCriteoBaseColumns + kCriteoMaxHistory))) {
    return stale("header out of range (damaged)");
  }
  const uint64_t expected = kHeaderBytes + points * (kPointBytes + kWindow) + (records + 1) * 8;
  if (own.size != expected)
    return stale(detail::concat(own.size, " bytes where its header implies ", expected, " (damaged)"));
  std::vector<unsigned char> head(kHeaderBytes + points * kPointBytes);
  if (!preadFull(fd, head.data(), 0, head.size(), &error)) return stale("unreadable access point table");
  const uint32_t crc = getU32(head.data() + 72);
  putU32(head.data() + 72, 0);
  if (crc32(0L, head.data(), static_cast<uInt>(head.size())) != crc) return stale("CRC mismatch (damaged)");

  index.gzip = gzip;
  index.data = stamp;
  index.text_size = getU64(h + 32);
  index.records = records;
  index.columns = columns;
  index.span = getU64(h + 56);
  index.points.resize(points);
  for (size_t k = 0; k < points; ++k) {
    const unsigned char* p = head.data() + kHeaderBytes + k * kPointBytes;
    index.points[k] = {getU64(p), getU64(p + 8), getU64(p + 16), getU32(p + 24)};
  }
  index.windowsAt = kHeaderBytes + points * kPointBytes;
  index.offsetsAt = index.windowsAt + points * kWindow;
  uint64_t ends[2] = {1, 1};
  if (!preadFull(fd, &ends[0], index.offsetsAt, 8, &error) ||
      !preadFull(fd, &ends[1], index.offsetsAt + records * 8, 8, &error) || ends[0] != 0 ||
      ends[1] != index.text_size || (gzip && records > 0 && (points == 0 || index.points[0].out != 0))) {
    index.points.clear();
    return stale("offsets do not span the text (damaged)");
  }
  index.offsets.clear();
  index.windows.clear();
  index.fd = fd;
  index.info.path = path;
  index.info.store = CriteoIndexStore::kFile;
  return LoadResult::kLoaded;
}

void scanPlain(int fd, const std::string& path, Index& index) {
  LineScanner scanner(path);
  std::vector<unsigned char> buffer(kScanChunk);
  uint64_t offset = 0;
  for (;;) {
    const ssize_t got = ::pread(fd, buffer.data(), buffer.size(), static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw ConfigError(detail::concat(path, ": byte ", offset, ": cannot read (", errnoText(errno), ")"));
    }
    if (got == 0) break;
    scanner.feed(buffer.data(), static_cast<size_t>(got));
    offset += static_cast<uint64_t>(got);
  }
  scanner.finish();
  index.text_size = offset;
  index.columns = scanner.columns() < 0 ? 0 : scanner.columns();
  index.offsets = std::move(scanner.starts());
  index.records = index.offsets.size() - 1;
}

// zran.c's build_index over the whole file, with the line scan fed by the
// inflated text, and concatenated members followed across their boundaries.
void scanGzip(int fd, const std::string& path, uint64_t span, Index& index) {
  LineScanner scanner(path);
  z_stream strm{};
  if (inflateInit2(&strm, 47) != Z_OK) throw ConfigError(path + ": zlib could not start (out of memory?)");
  struct Ender {
    z_stream* s;
    ~Ender() { inflateEnd(s); }
  } ender{&strm};

  std::vector<unsigned char> in(kScanChunk);
  // The last 32 KiB of text always sit just before `have`, so an access point
  // copies its window from one place.
  std::vector<unsigned char> out(kWindow + kInflateOut, 0);
  size_t have = kWindow;
  uint64_t fileOffset = 0;  // next compressed byte to read
  uint64_t totin = 0;       // compressed bytes consumed by inflate
  uint64_t totout = 0;
  uint64_t last = 0;
  bool eof = false;
  auto damaged = [&](const char* what) {
    throw ConfigError(detail::concat(path, ": byte ", totin, ": ", what, strm.msg ? " (zlib: " : "",
                                     strm.msg ? strm.msg : "", strm.msg ? ")" : "",
                                     "; the gzip file is damaged or truncated (check it with gzip -t)"));
  };
  // Keeps the unread input and appends more; false at end of file.
  auto refill = [&]() {
    if (eof) return false;
    if (strm.avail_in > 0) std::memmove(in.data(), strm.next_in, strm.avail_in);
    const size_t kept = strm.avail_in;
    ssize_t got;
    do {
      got = ::pread(fd, in.data() + kept, in.size() - kept, static_cast<off_t>(fileOffset));
    } while (got < 0 && errno == EINTR);
    if (got < 0)
      throw ConfigError(detail::concat(path, ": byte ", fileOffset, ": cannot read (", errnoText(errno), ")"));
    if (got == 0) eof = true;
    fileOffset += static_cast<uint64_t>(got);
    strm.next_in = in.data();
    strm.avail_in = static_cast<uInt>(kept + static_cast<size_t>(got));
    return got > 0;
  };

  for (;;) {
    if (strm.avail_in == 0 && !refill()) damaged("the gzip stream ends before its end marker");
    strm.next_out = out.data() + have;
    strm.avail_out = static_cast<uInt>(out.size() - have);
    const uInt inBefore = strm.avail_in;
    const int ret = inflate(&strm, Z_BLOCK);
    const size_t produced = out.size() - have - strm.avail_out;
    totin += inBefore - strm.avail_in;
    if (ret == Z_NEED_DICT || ret == Z_DATA_ERROR || ret == Z_MEM_ERROR || ret == Z_STREAM_ERROR) {
      damaged("invalid gzip data");
    }
    scanner.feed(out.data() + have, produced);
    have += produced;
    totout += produced;
    if (ret == Z_STREAM_END) {
      // Another member may follow (cat a.gz b.gz); anything else is not ours.
      while (strm.avail_in < 2 && refill()) {
      }
      if (strm.avail_in == 0) break;
      if (strm.avail_in < 2 || strm.next_in[0] != 0x1f || strm.next_in[1] != 0x8b) {
        throw ConfigError(detail::concat(path, ": byte ", totin,
                                         ": data after the end of the gzip stream that is not "
                                         "another gzip member; cut it off (gzip -dc FILE | gzip > NEW)"));
      }
      inflateReset(&strm);
    } else if ((strm.data_type & 128) && !(strm.data_type & 64) && (totout == 0 || totout - last > span)) {
      AccessPoint point;
      point.in = totin;
      point.out = totout;
      point.bits = static_cast<uint32_t>(strm.data_type & 7);
      point.first_record = scanner.recordsStarted();
      index.points.push_back(point);
      index.windows.insert(index.windows.end(), out.begin() + static_cast<std::ptrdiff_t>(have - kWindow),
                           out.begin() + static_cast<std::ptrdiff_t>(have));
      last = totout;
    }
    if (have == out.size()) {
      std::memmove(out.data(), out.data() + have - kWindow, kWindow);
      have = kWindow;
    }
  }
  scanner.finish();
  index.text_size = totout;
  index.columns = scanner.columns() < 0 ? 0 : scanner.columns();
  index.offsets = std::move(scanner.starts());
  index.records = index.offsets.size() - 1;
}

// ---- parsing ----

struct ParseContext {
  const std::string* path;
  const int64_t* tableSizes;
  int64_t itemTable;
  int64_t columns;
  int64_t historyLength;  // H of the output rows
};

[[noreturn]] void fieldError(const ParseContext& ctx, int64_t line, int64_t column, const char* b, const char* e,
                             const char* problem, const char* help) {
  std::string name;
  if (column == 0) {
    name = "the label";
  } else if (column <= kCriteoDenseFeatures) {
    name = detail::concat("integer feature I", column);
  } else if (column < kCriteoBaseColumns) {
    name = detail::concat("categorical feature C", column - kCriteoDenseFeatures);
  } else {
    name = detail::concat("history slot ", column - kCriteoBaseColumns + 1);
  }
  throw ConfigError(detail::concat(*ctx.path, ":", line, ": column ", column + 1, " (", name, ") is ", shown(b, e),
                                   ", ", problem, "; ", help));
}

// An integer count: empty is 0 (missing), negatives become 0 (DLRM).
inline int64_t parseCount(const ParseContext& ctx, int64_t line, int64_t column, const char* b, const char* e) {
  if (b == e) return 0;
  const char* p = b;
  const bool negative = *p == '-';
  if (negative) ++p;
  if (p == e)
    fieldError(ctx, line, column, b, e, "not an integer", "Criteo's integer columns hold decimal counts or nothing");
  uint64_t v = 0;
  for (; p < e; ++p) {
    const unsigned d = static_cast<unsigned char>(*p) - '0';
    if (d > 9)
      fieldError(ctx, line, column, b, e, "not an integer", "Criteo's integer columns hold decimal counts or nothing");
    if (v > (uint64_t{INT64_MAX} - d) / 10) {
      fieldError(ctx, line, column, b, e, "past 64 bits",
                 "Criteo's counts fit in a 64-bit integer (is the file damaged?)");
    }
    v = v * 10 + d;
  }
  return negative ? 0 : static_cast<int64_t>(v);
}

// A hex id as an unsigned 64-bit value; b != e.
inline uint64_t parseHex(const ParseContext& ctx, int64_t line, int64_t column, const char* b, const char* e) {
  uint64_t v = 0;
  for (const char* p = b; p < e; ++p) {
    const unsigned char c = static_cast<unsigned char>(*p);
    unsigned d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
      d = (c | 0x20) - 'a' + 10;
    } else {
      fieldError(ctx, line, column, b, e, "not hex",
                 "categorical and history columns hold hex ids (8 digits in Criteo's data) or nothing");
    }
    if (v >> 60) fieldError(ctx, line, column, b, e, "past 64 bits", "a hex id has at most 16 significant digits");
    v = (v << 4) | d;
  }
  return v;
}

[[noreturn]] void columnsError(const ParseContext& ctx, int64_t line, const char* b, const char* e) {
  throw ConfigError(detail::concat(*ctx.path, ":", line, ": ", 1 + std::count(b, e, '\t'),
                                   " columns where its index says ", ctx.columns,
                                   "; the file changed after it was indexed: open it again"));
}

// One record [b, e), its line end removed, into the row pointers (`history`
// holds H slots; null when H is 0, and then the file has no history columns).
void parseRecord(const ParseContext& ctx, int64_t line, const char* b, const char* e, float* label, float* dense,
                 int64_t* sparse, int64_t* history, int64_t* historyLength) {
  int64_t column = 0;
  const char* p = b;
  bool emptySlot = false;
  int64_t valid = 0;
  for (;;) {
    const auto* tab = static_cast<const char*>(std::memchr(p, '\t', static_cast<size_t>(e - p)));
    const char* fe = tab ? tab : e;
    if (column >= ctx.columns) columnsError(ctx, line, b, e);
    if (column == 0) {
      if (fe - p != 1 || (*p != '0' && *p != '1')) {
        fieldError(ctx, line, column, p, fe, "not a label", "a label is 0 or 1");
      }
      *label = *p == '1' ? 1.0f : 0.0f;
    } else if (column <= kCriteoDenseFeatures) {
      dense[column - 1] = criteoLogCount(parseCount(ctx, line, column, p, fe));
    } else if (column < kCriteoBaseColumns) {
      const int64_t t = column - 1 - kCriteoDenseFeatures;
      const uint64_t v = p == fe ? 0 : parseHex(ctx, line, column, p, fe);
      sparse[t] = static_cast<int64_t>(v % static_cast<uint64_t>(ctx.tableSizes[t]));
    } else if (p == fe) {
      emptySlot = true;
    } else {
      if (emptySlot) {
        fieldError(ctx, line, column, p, fe, "an item after an empty slot",
                   "put a line's history items first and leave its empty slots last");
      }
      const uint64_t v = parseHex(ctx, line, column, p, fe);
      history[valid++] = static_cast<int64_t>(v % static_cast<uint64_t>(ctx.tableSizes[ctx.itemTable]));
    }
    ++column;
    if (!tab) break;
    p = tab + 1;
  }
  if (column != ctx.columns) columnsError(ctx, line, b, e);
  for (int64_t k = valid; k < ctx.historyLength; ++k) history[k] = -1;
  *historyLength = valid;
}

}  // namespace

// ---- CriteoDataset ----

CriteoDataset::CriteoDataset(std::string path, CriteoOptions options)
    : path_(std::move(path)), options_(std::move(options)), index_(std::make_unique<Index>()) {
  const std::string where = "criteo dataset " + path_ + ": ";
  if (static_cast<int64_t>(options_.table_sizes.size()) != kCriteoSparseFeatures) {
    throw ConfigError(detail::concat(where, "table_sizes has ", options_.table_sizes.size(),
                                     " entries; give one size for each of the ", kCriteoSparseFeatures,
                                     " categorical features"));
  }
  for (size_t t = 0; t < options_.table_sizes.size(); ++t) {
    if (options_.table_sizes[t] < 1 || options_.table_sizes[t] > (int64_t{1} << 62)) {
      throw ConfigError(
          detail::concat(where, "table_sizes[", t, "] is ", options_.table_sizes[t], "; a table has 1 to 2^62 rows"));
    }
  }
  if (options_.item_feature < 0 || options_.item_feature >= kCriteoSparseFeatures) {
    throw ConfigError(detail::concat(where, "item_feature is ", options_.item_feature,
                                     "; it names a categorical feature in [0, 26)"));
  }
  if (options_.history_length < -1 || options_.history_length > kCriteoMaxHistory) {
    throw ConfigError(detail::concat(where, "history_length is ", options_.history_length,
                                     "; give -1 (the file's) or 0 to ", kCriteoMaxHistory));
  }
  if (options_.access_point_span < (int64_t{64} << 10) || options_.access_point_span > (int64_t{1} << 30)) {
    throw ConfigError(detail::concat(where, "access_point_span is ", options_.access_point_span,
                                     "; give 65536 to 1073741824 bytes (the default is 1 MiB)"));
  }

  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw ConfigError(detail::concat(path_, ": cannot open (", errnoText(errno), "); check the data path"));
  struct Closer {
    int& fd;
    bool armed = true;
    ~Closer() {
      if (armed && fd >= 0) {
        ::close(fd);
        fd = -1;
      }
    }
  } closer{fd_};
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    throw ConfigError(detail::concat(path_, ": not a regular file; give the path of a Criteo TSV file (plain or .gz)"));
  }
  const FileStamp stamp = stampOf(fd_);
  unsigned char magic[2] = {0, 0};
  int error = 0;
  const bool gzip = preadFull(fd_, magic, 0, 2, &error) && magic[0] == 0x1f && magic[1] == 0x8b;

  // Where an index may already be, and where a new one goes.
  const fs::path beside = path_ + kCriteoIndexSuffix;
  std::vector<fs::path> candidates{beside};
  fs::path target = beside;
  if (!options_.index_dir.empty()) {
    std::error_code ec;
    const fs::path absolute = fs::weakly_canonical(fs::absolute(path_, ec), ec);
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a(absolute.string())));
    target = fs::path(options_.index_dir) / (fs::path(path_).filename().string() + "." + hash + kCriteoIndexSuffix);
    candidates.push_back(target);
  }
  std::string staleWhy;
  bool loaded = false;
  for (const fs::path& candidate : candidates) {
    auto attempt = std::make_unique<Index>();
    std::string why;
    const LoadResult result = loadIndexFile(candidate.string(), stamp, gzip, *attempt, why);
    if (result == LoadResult::kLoaded) {
      attempt->info.origin = CriteoIndexOrigin::kLoaded;
      index_ = std::move(attempt);
      loaded = true;
      break;
    }
    if (result == LoadResult::kStale && staleWhy.empty()) staleWhy = why;
    if (result == LoadResult::kForeign && candidate == target && options_.write_index) {
      throw ConfigError(detail::concat(candidate.string(),
                                       ": not a ptrain index (it does not start with \"PTRCRIDX\"), "
                                       "and ptrain would write the index of ",
                                       path_,
                                       " there; move it away or delete "
                                       "it, or pass CriteoOptions::index_dir to keep the index elsewhere"));
    }
  }

  if (!loaded) {
    Index& built = *index_;
    built.gzip = gzip;
    built.data = stamp;
    built.span = gzip ? static_cast<uint64_t>(options_.access_point_span) : 0;
    if (gzip) {
      scanGzip(fd_, path_, built.span, built);
    } else {
      scanPlain(fd_, path_, built);
    }
    const FileStamp after = stampOf(fd_);
    if (after.size != stamp.size || after.mtime_ns != stamp.mtime_ns || (!gzip && built.text_size != stamp.size)) {
      throw ConfigError(
          detail::concat(path_, ": changed while it was being indexed; open it again once it is complete"));
    }
    built.info.origin = CriteoIndexOrigin::kBuilt;
    built.info.rebuilt_because = staleWhy;
    built.info.store = CriteoIndexStore::kMemory;
    std::string failure;
    if (!options_.write_index) {
      failure = "CriteoOptions::write_index is false";
    } else {
      std::error_code ec;
      if (!options_.index_dir.empty()) fs::create_directories(options_.index_dir, ec);
      failure = writeIndexFile(built, target);
      if (failure.empty()) {
        // Served from the file from now on, so this process holds no more of
        // the index than one that loads it.
        auto reopened = std::make_unique<Index>();
        std::string why;
        if (loadIndexFile(target.string(), stamp, gzip, *reopened, why) == LoadResult::kLoaded) {
          reopened->info.origin = CriteoIndexOrigin::kBuilt;
          reopened->info.rebuilt_because = staleWhy;
          index_ = std::move(reopened);
        } else {
          failure = why;
        }
      }
    }
    index_->info.memory_because = failure;
  }
  Index& index = *index_;
  index.info.gzip = index.gzip;
  index.info.columns = index.columns;
  index.info.text_bytes = index.text_size;
  index.info.access_points = static_cast<int64_t>(index.points.size());
  index.info.access_point_span = static_cast<int64_t>(index.span);

  const int64_t fileHistory = fileHistoryColumns();
  if (options_.history_length < 0) {
    historyLength_ = fileHistory;
  } else {
    historyLength_ = options_.history_length;
    if (fileHistory > 0 && fileHistory != historyLength_) {
      throw ConfigError(detail::concat(path_, ":1: ", index.columns, " columns give ", fileHistory,
                                       " history slots but history_length is ", historyLength_,
                                       "; set history_length to ", fileHistory, " (or -1 to take the file's)"));
    }
  }
  closer.armed = false;
}

CriteoDataset::~CriteoDataset() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t CriteoDataset::recordCount() const { return static_cast<int64_t>(index_->records); }

int64_t CriteoDataset::fileHistoryColumns() const {
  return index_->columns > kCriteoBaseColumns ? index_->columns - kCriteoBaseColumns : 0;
}

const CriteoIndexInfo& CriteoDataset::indexInfo() const { return index_->info; }

std::pair<uint64_t, uint64_t> CriteoDataset::recordBytes(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || static_cast<uint64_t>(first) + static_cast<uint64_t>(count) > index_->records) {
    throw ConfigError(detail::concat(path_, ": records [", first, ", ", first + count, ") asked for; the file has ",
                                     index_->records, " records"));
  }
  uint64_t ends[2];
  index_->readOffsets(static_cast<uint64_t>(first), 1, &ends[0], indexBytesRead_);
  index_->readOffsets(static_cast<uint64_t>(first + count), 1, &ends[1], indexBytesRead_);
  return {ends[0], ends[1]};
}

CriteoReadStats CriteoDataset::readStats() const {
  CriteoReadStats stats;
  stats.reads = reads_.load();
  stats.data_bytes_read = dataBytesRead_.load();
  stats.bytes_inflated = bytesInflated_.load();
  stats.index_bytes_read = indexBytesRead_.load();
  return stats;
}

void CriteoDataset::resetReadStats() {
  reads_ = 0;
  dataBytesRead_ = 0;
  bytesInflated_ = 0;
  indexBytesRead_ = 0;
}

void CriteoDataset::preadData(void* out, uint64_t offset, uint64_t length) const {
  int error = 0;
  if (!preadFull(fd_, out, offset, length, &error)) {
    throw ConfigError(detail::concat(path_, ": byte ", offset, ": cannot read ", length, " bytes (",
                                     error ? errnoText(error) : "the file is shorter than its index says",
                                     "); if the file changed, open it again to rebuild its index"));
  }
  dataBytesRead_ += length;
  if (options_.observer) options_.observer(offset, length);
}

std::string CriteoDataset::readText(uint64_t begin, uint64_t end) const {
  if (index_->gzip) return readGzipText(begin, end);
  std::string text(end - begin, '\0');
  if (end > begin) preadData(text.data(), begin, end - begin);
  return text;
}

// zran.c's extract: raw inflate from the access point, primed with its bits
// and window, keeping only [begin, end).
std::string CriteoDataset::readGzipText(uint64_t begin, uint64_t end) const {
  std::string text;
  if (end <= begin) return text;
  text.reserve(end - begin);
  const Index& index = *index_;
  const auto after = std::upper_bound(index.points.begin(), index.points.end(), begin,
                                      [](uint64_t value, const AccessPoint& p) { return value < p.out; });
  if (after == index.points.begin()) {
    throw ConfigError(detail::concat(index.info.path.empty() ? path_ : index.info.path,
                                     ": the index has no access point before text byte ", begin,
                                     "; delete it and open the data again to rebuild it"));
  }
  const size_t k = static_cast<size_t>(after - index.points.begin()) - 1;
  const AccessPoint& point = index.points[k];

  z_stream strm{};
  if (inflateInit2(&strm, -15) != Z_OK) throw ConfigError(path_ + ": zlib could not start (out of memory?)");
  struct Ender {
    z_stream* s;
    ~Ender() { inflateEnd(s); }
  } ender{&strm};

  std::vector<unsigned char> in(kExtractChunk);
  std::vector<unsigned char> out(kInflateOut);
  uint64_t inPos = point.in - (point.bits ? 1 : 0);
  auto refill = [&]() {
    const uint64_t length = std::min<uint64_t>(kExtractChunk, index.data.size > inPos ? index.data.size - inPos : 0);
    if (length == 0) {
      throw ConfigError(detail::concat(path_, ": the gzip data ends before text byte ", end,
                                       "; the file changed after it was indexed: open it again"));
    }
    preadData(in.data(), inPos, length);
    inPos += length;
    strm.next_in = in.data();
    strm.avail_in = static_cast<uInt>(length);
  };
  refill();
  if (point.bits) {
    const int byte = strm.next_in[0];
    ++strm.next_in;
    --strm.avail_in;
    inflatePrime(&strm, static_cast<int>(point.bits), byte >> (8 - point.bits));
  }
  if (point.out > 0) {
    std::vector<unsigned char> window(kWindow);
    index.readWindow(k, window.data(), indexBytesRead_);
    inflateSetDictionary(&strm, window.data(), static_cast<uInt>(kWindow));
  }

  bool raw = true;
  unsigned skip = 0;  // trailer bytes of a finished member still to pass
  uint64_t outPos = point.out;
  uint64_t inflated = 0;
  while (outPos < end) {
    if (strm.avail_in == 0) refill();
    if (skip > 0) {
      const unsigned n = std::min<unsigned>(skip, strm.avail_in);
      strm.next_in += n;
      strm.avail_in -= n;
      skip -= n;
      continue;
    }
    strm.next_out = out.data();
    strm.avail_out = static_cast<uInt>(out.size());
    const int ret = inflate(&strm, Z_NO_FLUSH);
    if (ret == Z_NEED_DICT || ret == Z_DATA_ERROR || ret == Z_MEM_ERROR || ret == Z_STREAM_ERROR) {
      throw ConfigError(detail::concat(path_, ": byte ", inPos - strm.avail_in,
                                       ": invalid gzip data (zlib: ", strm.msg ? strm.msg : "error",
                                       "); the file changed after it was indexed or is "
                                       "damaged (check it with gzip -t)"));
    }
    const uint64_t produced = out.size() - strm.avail_out;
    const uint64_t from = std::max(outPos, begin);
    const uint64_t to = std::min(outPos + produced, end);
    if (to > from) text.append(reinterpret_cast<const char*>(out.data()) + (from - outPos), to - from);
    outPos += produced;
    inflated += produced;
    if (ret == Z_STREAM_END) {
      // Raw inflate stops before the member's trailer; zlib's gzip mode reads
      // the next member's header (and its trailer) itself.
      if (raw) skip = kGzipTrailer;
      raw = false;
      inflateReset2(&strm, 31);
    }
  }
  bytesInflated_ += inflated;
  return text;
}

CriteoExamples CriteoDataset::readRecords(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || static_cast<uint64_t>(first) + static_cast<uint64_t>(count) > index_->records) {
    throw ConfigError(detail::concat(path_, ": records [", first, ", ", first + count, ") asked for; the file has ",
                                     index_->records, " records"));
  }
  ++reads_;
  CriteoExamples examples;
  examples.count = count;
  examples.history_length = historyLength_;
  if (count == 0) return examples;
  const FileStamp now = stampOf(fd_);
  if (now.size != index_->data.size || now.mtime_ns != index_->data.mtime_ns) {
    throw ConfigError(detail::concat(path_, ": changed after it was opened (", now.size, " bytes, was ",
                                     index_->data.size, "); open it again to rebuild its index"));
  }
  std::vector<uint64_t> offsets(static_cast<size_t>(count) + 1);
  index_->readOffsets(static_cast<uint64_t>(first), offsets.size(), offsets.data(), indexBytesRead_);
  const std::string text = readText(offsets.front(), offsets.back());

  const auto n = static_cast<size_t>(count);
  const auto h = static_cast<size_t>(historyLength_);
  examples.sparse.resize(n * kCriteoSparseFeatures);
  examples.dense.resize(n * kCriteoDenseFeatures);
  examples.history.resize(n * h);
  examples.history_lengths.resize(n);
  examples.labels.resize(n);
  ParseContext ctx{&path_, options_.table_sizes.data(), options_.item_feature, index_->columns, historyLength_};
  for (size_t i = 0; i < n; ++i) {
    const int64_t line = first + static_cast<int64_t>(i) + 1;
    if (offsets[i + 1] < offsets[i] || offsets[i + 1] > offsets.back()) {
      throw ConfigError(detail::concat(path_, ":", line, ": its index's offsets are out of order; delete ",
                                       index_->info.path, " and open the data again"));
    }
    const char* b = text.data() + (offsets[i] - offsets.front());
    const char* e = text.data() + (offsets[i + 1] - offsets.front());
    // A record is its bytes up to one "\n": anything else means the offsets
    // and the data disagree.
    const bool lastOfFile = static_cast<uint64_t>(line) == index_->records;
    const bool endsLine = e > b && e[-1] == '\n';
    if (endsLine) --e;
    if ((!endsLine && !lastOfFile) || e == b || std::memchr(b, '\n', static_cast<size_t>(e - b)) != nullptr) {
      throw ConfigError(detail::concat(path_, ":", line,
                                       ": the record is not where its index says; the file changed "
                                       "after it was indexed: open it again"));
    }
    if (e[-1] == '\r') --e;
    parseRecord(ctx, line, b, e, &examples.labels[i], examples.dense.data() + i * kCriteoDenseFeatures,
                examples.sparse.data() + i * kCriteoSparseFeatures, h > 0 ? examples.history.data() + i * h : nullptr,
                &examples.history_lengths[i]);
  }
  return examples;
}

}  // namespace ptrain::datasets

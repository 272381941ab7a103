#include "ptrain/datasets/criteo_dataset.h"

#include "ptrain/core/error.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

namespace ptrain::datasets {
namespace {

// Bytes gathered before each write(2) (and each deflate call).
constexpr size_t kFlushBytes = size_t{1} << 20;

void appendDecimal(std::string& line, int64_t value) {
  char digits[24];
  const auto result = std::to_chars(digits, digits + sizeof digits, value);
  line.append(digits, result.ptr);
}

// At least 8 lowercase hex digits, Criteo's own spelling of an id.
void appendHex(std::string& line, int64_t value) {
  char digits[24];
  const auto result = std::to_chars(digits, digits + sizeof digits, static_cast<uint64_t>(value), 16);
  const auto n = static_cast<size_t>(result.ptr - digits);
  if (n < 8) line.append(8 - n, '0');
  line.append(digits, n);
}

}  // namespace

// The temp file and, for gzip, its deflate stream.
struct CriteoWriter::Sink {
  std::string temp;
  int fd = -1;
  bool gzip = false;
  bool deflating = false;
  z_stream strm{};
  std::string pending;             // text not yet written (or deflated)
  std::vector<unsigned char> out;  // deflate's output

  ~Sink() {
    if (deflating) deflateEnd(&strm);
    if (fd >= 0) {
      ::close(fd);
      ::unlink(temp.c_str());
    }
  }

  [[noreturn]] void fail(const std::string& path, const char* what, int error) const {
    throw ConfigError(detail::concat("criteo writer: ", path, ": ", what, " (", std::strerror(error),
                                     "); check that the folder exists, is writable and has space"));
  }

  void put(const std::string& path, const void* data, size_t length) {
    const auto* p = static_cast<const char*>(data);
    while (length > 0) {
      const ssize_t n = ::write(fd, p, length);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail(path, "cannot write", errno);
      }
      p += n;
      length -= static_cast<size_t>(n);
    }
  }

  // Hands `pending` on: to the file, or through deflate (flush Z_FINISH at the end).
  void drain(const std::string& path, int flush) {
    if (!gzip) {
      put(path, pending.data(), pending.size());
      pending.clear();
      return;
    }
    strm.next_in = reinterpret_cast<Bytef*>(pending.data());
    strm.avail_in = static_cast<uInt>(pending.size());
    int ret;
    do {
      strm.next_out = out.data();
      strm.avail_out = static_cast<uInt>(out.size());
      ret = deflate(&strm, flush);
      if (ret == Z_STREAM_ERROR) throw ConfigError("criteo writer: " + path + ": zlib's deflate failed");
      put(path, out.data(), out.size() - strm.avail_out);
    } while (strm.avail_out == 0 || (flush == Z_FINISH && ret != Z_STREAM_END));
    pending.clear();
  }
};

CriteoWriter::CriteoWriter(std::string path, CriteoWriterOptions options)
    : path_(std::move(path)), options_(options), sink_(std::make_unique<Sink>()) {
  if (options_.history_length < 0 || options_.history_length > kCriteoMaxHistory) {
    throw ConfigError(detail::concat("criteo writer: ", path_, ": history_length is ", options_.history_length,
                                     "; give 0 (no history columns) to ", kCriteoMaxHistory));
  }
  if (options_.gzip && (options_.gzip_level < 1 || options_.gzip_level > 9)) {
    throw ConfigError(
        detail::concat("criteo writer: ", path_, ": gzip_level is ", options_.gzip_level, "; give 1 to 9"));
  }
  static std::atomic<uint64_t> counter{0};
  Sink& sink = *sink_;
  sink.temp = detail::concat(path_, ".tmp.", ::getpid(), ".", counter++);
  sink.fd = ::open(sink.temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (sink.fd < 0) sink.fail(sink.temp, "cannot create", errno);
  sink.gzip = options_.gzip;
  if (sink.gzip) {
    // windowBits 15 + 16: a gzip wrapper whose header zlib writes without a
    // name and with mtime 0, so the same records give the same bytes.
    if (deflateInit2(&sink.strm, options_.gzip_level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
      throw ConfigError("criteo writer: " + path_ + ": zlib's deflate could not start (out of memory?)");
    }
    sink.deflating = true;
    sink.out.resize(kFlushBytes / 4);
  }
  sink.pending.reserve(kFlushBytes + 4096);
}

CriteoWriter::~CriteoWriter() = default;

void CriteoWriter::write(float label, const int64_t* counts, const int64_t* ids, const int64_t* history,
                         int64_t historyLength) {
  const auto record = [&] { return detail::concat("criteo writer: ", path_, ": record ", records_, ": "); };
  if (sink_ == nullptr || sink_->fd < 0) {
    throw ConfigError(detail::concat(record(), "written after commit(); open another writer"));
  }
  if (label != 0.0f && label != 1.0f)
    throw ConfigError(detail::concat(record(), "label ", label, "; a label is 0 or 1"));
  const int64_t slots = options_.history_length;
  if (slots > 0 && (historyLength < 0 || historyLength > slots)) {
    throw ConfigError(detail::concat(record(), "history length ", historyLength, " outside [0, ", slots,
                                     "] (CriteoWriterOptions::history_length)"));
  }
  line_.clear();
  line_ += label == 1.0f ? '1' : '0';
  for (int64_t k = 0; k < kCriteoDenseFeatures; ++k) {
    line_ += '\t';
    appendDecimal(line_, counts[k]);
  }
  for (int64_t t = 0; t < kCriteoSparseFeatures; ++t) {
    if (ids[t] < 0) {
      throw ConfigError(detail::concat(record(), "categorical C", t + 1, " is ", ids[t],
                                       "; ids are >= 0 (hash them into their table first)"));
    }
    line_ += '\t';
    appendHex(line_, ids[t]);
  }
  for (int64_t k = 0; k < slots; ++k) {
    line_ += '\t';
    if (k < historyLength) {
      if (history[k] < 0) {
        throw ConfigError(detail::concat(record(), "history item ", k, " is ", history[k],
                                         "; items within the history length are ids >= 0"));
      }
      appendHex(line_, history[k]);
    }
  }
  line_ += '\n';
  sink_->pending += line_;
  if (sink_->pending.size() >= kFlushBytes) sink_->drain(path_, Z_NO_FLUSH);
  ++records_;
}

void CriteoWriter::commit() {
  Sink& sink = *sink_;
  if (sink.fd < 0) throw ConfigError("criteo writer: " + path_ + ": commit() called twice");
  sink.drain(path_, sink.gzip ? Z_FINISH : Z_NO_FLUSH);
  if (::fsync(sink.fd) != 0) sink.fail(path_, "cannot fsync", errno);
  if (::close(sink.fd) != 0) {
    sink.fd = -1;
    ::unlink(sink.temp.c_str());
    sink.fail(path_, "cannot close", errno);
  }
  sink.fd = -1;
  if (::rename(sink.temp.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(sink.temp.c_str());
    sink.fail(path_, "cannot rename the finished file into place", error);
  }
  // The rename itself survives a crash only once the folder is synced.
  const std::string folder = std::filesystem::path(path_).parent_path().string();
  const int dir = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

}  // namespace ptrain::datasets

#include "engine/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include "ptrain/core/resources.h"

namespace ptrain {

namespace {

// Byte-at-a-time table for the reflected Castagnoli polynomial. Event records are a few dozen bytes
// written once per metrics row, so a faster (sliced or SSE4.2) CRC would buy nothing here.
constexpr std::array<uint32_t, 256> makeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) != 0 ? 0x82F63B78u : 0u);
    table[i] = crc;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = makeCrc32cTable();

// Protobuf's wire format, by hand: the five messages written here need only varints, fixed 32/64-bit
// numbers and length-delimited fields, and a protobuf dependency would be the only one this file had.
// Field numbers are TensorBoard's (tensorboard/compat/proto: event.proto, summary.proto, tensor.proto).
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void putVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void putTag(std::string& out, uint32_t field, WireType type) { putVarint(out, (uint64_t{field} << 3) | type); }

// Little-endian whatever the host's order: the wire format and TFRecord's framing both fix it.
void putLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

void putBytes(std::string& out, uint32_t field, const std::string& bytes) {
  putTag(out, field, kLengthDelimited);
  putVarint(out, bytes.size());
  out += bytes;
}

void putDouble(std::string& out, uint32_t field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  putTag(out, field, kFixed64);
  putLittleEndian(out, bits, 8);
}

void putFloat(std::string& out, uint32_t field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  putTag(out, field, kFixed32);
  putLittleEndian(out, bits, 4);
}

// int64 fields are plain varints of the two's complement (a negative step takes ten bytes).
void putInt64(std::string& out, uint32_t field, int64_t value) {
  putTag(out, field, kVarint);
  putVarint(out, static_cast<uint64_t>(value));
}

// Event{wall_time = 1, step = 2, summary = 5} holding Summary{value = 1} with one Summary.Value.
std::string summaryEvent(double wallTime, int64_t step, const std::string& value) {
  std::string summary;
  putBytes(summary, 1, value);
  std::string event;
  putDouble(event, 1, wallTime);
  putInt64(event, 2, step);
  putBytes(event, 5, summary);
  return event;
}

std::string hostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = kCrc32cTable[(crc ^ bytes[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

// TFRecord stores CRCs masked, because a CRC computed over data that itself holds CRCs is weak.
uint32_t maskedCrc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw std::runtime_error("TensorBoard folder " + dir + ": cannot create it: " + error.message());

  // The name is what TensorFlow's own writers use (TensorBoard takes any name containing "tfevents"),
  // with this process's id, so that two processes never share a file. O_EXCL: a writer never appends to
  // or truncates another's file, even one of this process opened in the same second (tests, a restart
  // inside one process), which gets a counted suffix instead: ".001" and on, zero-padded so that the
  // names sort in the order the files were opened, the order TensorBoard reads a folder's files in.
  const std::string name = "events.out.tfevents." + std::to_string(std::time(nullptr)) + "." + hostName() + "." +
                           std::to_string(getpid()) + ".ptrain";
  const std::string base = (std::filesystem::path(dir) / name).string();
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    char suffix[8] = "";
    if (attempt > 0) std::snprintf(suffix, sizeof suffix, ".%03d", attempt);
    path_ = base + suffix;
    fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || attempt >= 999)) {
      throw std::runtime_error("TensorBoard event file " + path_ + ": cannot open it: " + std::strerror(errno));
    }
  }
  file_ = ::fdopen(fd, "wb");
  if (file_ == nullptr) {
    const int fdopenError = errno;
    ::close(fd);
    throw std::runtime_error("TensorBoard event file " + path_ + ": cannot open it: " + std::strerror(fdopenError));
  }

  // Readers check the version event first to know the format of the records after it.
  std::string event;
  putDouble(event, 1, epochNow());
  putBytes(event, 3, "brain.Event:2");
  writeRecord(event);
  try {
    flush();
  } catch (...) {
    std::fclose(file_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value, double wallTime) {
  std::string summaryValue;
  putBytes(summaryValue, 1, tag);
  putFloat(summaryValue, 2, static_cast<float>(value));
  writeRecord(summaryEvent(wallTime, step, summaryValue));
}

void TensorBoardWriter::text(const std::string& tag, int64_t step, const std::string& text, double wallTime) {
  // TensorProto{dtype = 1: DT_STRING (7), tensor_shape = 2: empty, i.e. a scalar, string_val = 8}.
  // The shape is written though empty, as TensorFlow writes it.
  std::string tensor;
  putTag(tensor, 1, kVarint);
  putVarint(tensor, 7);
  putBytes(tensor, 2, "");
  putBytes(tensor, 8, text);

  // SummaryMetadata{plugin_data = 1: PluginData{plugin_name = 1}}. The text plugin's own content
  // (TextPluginData, version 0) serializes to nothing, so it is left out.
  std::string pluginData;
  putBytes(pluginData, 1, "text");
  std::string metadata;
  putBytes(metadata, 1, pluginData);

  // Summary.Value{tag = 1, tensor = 8, metadata = 9}.
  std::string summaryValue;
  putBytes(summaryValue, 1, tag);
  putBytes(summaryValue, 8, tensor);
  putBytes(summaryValue, 9, metadata);
  writeRecord(summaryEvent(wallTime, step, summaryValue));
}

void TensorBoardWriter::flush() {
  // A failed fwrite leaves the stream's error flag set; it is reported here, once per batch of writes,
  // rather than from each write call.
  if (std::fflush(file_) != 0 || std::ferror(file_) != 0) {
    const int writeError = errno;
    std::clearerr(file_);
    throw std::runtime_error("TensorBoard event file " + path_ + ": cannot write to it: " + std::strerror(writeError));
  }
}

const std::string& TensorBoardWriter::path() const { return path_; }

void TensorBoardWriter::writeRecord(const std::string& event) {
  // TFRecord: uint64 length, masked CRC of those 8 bytes, the data, masked CRC of the data; all little-endian.
  std::string record;
  record.reserve(event.size() + 16);
  putLittleEndian(record, event.size(), 8);
  const uint32_t lengthCrc = maskedCrc32c(record.data(), 8);
  putLittleEndian(record, lengthCrc, 4);
  record += event;
  putLittleEndian(record, maskedCrc32c(event.data(), event.size()), 4);
  std::fwrite(record.data(), 1, record.size(), file_);
}

}  // namespace ptrain

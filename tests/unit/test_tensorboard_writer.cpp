// TensorBoard event files: the CRC against published vectors, the TFRecord framing and the protobuf
// encoding read back by a small reader of this test that shares no code with the writer, and the
// files read by TensorBoard's own reader (tests/tools/read_tensorboard.py) as a resumed run leaves
// them: two writers in one folder.
//
// Torch-free. framework/src is not on the tests' include path, hence the relative include.
#include "../../framework/src/engine/tensorboard_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::TensorBoardWriter;
using ptrain::test::TempDir;

namespace {

uint32_t crcOf(const std::string& text) { return ptrain::crc32c(text.data(), text.size()); }

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

uint64_t littleEndian(const std::string& bytes, size_t at, int size) {
  uint64_t value = 0;
  for (int i = 0; i < size; ++i) value |= uint64_t{static_cast<unsigned char>(bytes[at + i])} << (8 * i);
  return value;
}

// The records of one TFRecord file; a failure names the record and what is wrong with it.
std::vector<std::string> readRecords(const std::string& path) {
  const std::string file = readFile(path);
  std::vector<std::string> records;
  size_t at = 0;
  while (at < file.size()) {
    const std::string where = path + ": record " + std::to_string(records.size()) + " at byte " + std::to_string(at);
    if (file.size() - at < 12) throw std::runtime_error(where + ": truncated header");
    const uint64_t length = littleEndian(file, at, 8);
    if (littleEndian(file, at + 8, 4) != ptrain::maskedCrc32c(file.data() + at, 8)) {
      throw std::runtime_error(where + ": length CRC does not match");
    }
    if (file.size() - at - 12 < length + 4) throw std::runtime_error(where + ": truncated data");
    const std::string data = file.substr(at + 12, length);
    if (littleEndian(file, at + 12 + length, 4) != ptrain::maskedCrc32c(data.data(), data.size())) {
      throw std::runtime_error(where + ": data CRC does not match");
    }
    records.push_back(data);
    at += 12 + length + 4;
  }
  return records;
}

// One field of a protobuf message as it lies on the wire: a varint's value, or the 4, 8 or
// length-delimited bytes.
struct Field {
  int wireType;
  uint64_t varint = 0;
  std::string bytes;
};

uint64_t readVarint(const std::string& data, size_t& at) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (at >= data.size()) throw std::runtime_error("truncated varint");
    const auto byte = static_cast<unsigned char>(data[at++]);
    value |= uint64_t{byte & 0x7Fu} << shift;
    if ((byte & 0x80) == 0) return value;
  }
  throw std::runtime_error("varint longer than 10 bytes");
}

// Decodes one message level, by field number (a repeated field keeps every occurrence, in order).
std::multimap<int, Field> decode(const std::string& data) {
  std::multimap<int, Field> fields;
  size_t at = 0;
  while (at < data.size()) {
    const uint64_t key = readVarint(data, at);
    Field field;
    field.wireType = static_cast<int>(key & 7);
    size_t size = 0;
    switch (field.wireType) {
      case 0: field.varint = readVarint(data, at); break;
      case 1: size = 8; break;
      case 2: size = readVarint(data, at); break;
      case 5: size = 4; break;
      default: throw std::runtime_error("unexpected wire type " + std::to_string(field.wireType));
    }
    if (data.size() - at < size) throw std::runtime_error("truncated field " + std::to_string(key >> 3));
    field.bytes = data.substr(at, size);
    at += size;
    fields.emplace(static_cast<int>(key >> 3), field);
  }
  return fields;
}

// The one field `number` of `fields`, checked for its wire type.
const Field& only(const std::multimap<int, Field>& fields, int number, int wireType) {
  EXPECT_EQ(fields.count(number), 1u) << "field " << number;
  const auto found = fields.find(number);
  if (found == fields.end()) throw std::runtime_error("no field " + std::to_string(number));
  EXPECT_EQ(found->second.wireType, wireType) << "field " << number;
  return found->second;
}

double asDouble(const Field& field) {
  const uint64_t bits = littleEndian(field.bytes, 0, 8);
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

float asFloat(const Field& field) {
  const auto bits = static_cast<uint32_t>(littleEndian(field.bytes, 0, 4));
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// The event files of `dir`, by name.
std::vector<std::string> eventFiles(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().find("tfevents") != std::string::npos) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST(Crc32c, MatchesPublishedVectors) {
  // The check value of the CRC catalogue, and RFC 3720 (iSCSI) appendix B.4.
  EXPECT_EQ(crcOf("123456789"), 0xE3069283u);
  EXPECT_EQ(crcOf(""), 0u);
  EXPECT_EQ(crcOf(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crcOf(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crcOf(ascending), 0x46DD794Eu);
  EXPECT_EQ(crcOf(descending), 0x113FDB5Cu);
}

TEST(Crc32c, MaskedFormMatchesTensorBoard) {
  // Values of tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c.
  const std::string digits = "123456789", zeros(8, '\0');
  EXPECT_EQ(ptrain::maskedCrc32c(digits.data(), digits.size()), 0xC78AB0E5u);
  EXPECT_EQ(ptrain::maskedCrc32c(zeros.data(), zeros.size()), 0x07980329u);
  EXPECT_EQ(ptrain::maskedCrc32c("", 0), 0xA282EAD8u);
}

TEST(TensorBoardWriter, NamesEachFileForTensorBoardAndNeverReusesOne) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/tb/nested";  // created by the writer
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  const std::string suffix = "." + std::string(host) + "." + std::to_string(getpid()) + ".ptrain";

  TensorBoardWriter first(dir), second(dir);  // same process, almost surely the same second
  EXPECT_NE(first.path(), second.path());
  for (const std::string& path : {first.path(), second.path()}) {
    EXPECT_EQ(fs::path(path).parent_path(), fs::path(dir));
    EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u) << path;
    EXPECT_NE(path.find(suffix), std::string::npos) << path;
  }
  // TensorBoard reads a folder's files in name order: the second writer's must come after.
  EXPECT_LT(first.path(), second.path());
  EXPECT_EQ(eventFiles(dir), (std::vector<std::string>{first.path(), second.path()}));
}

TEST(TensorBoardWriter, ThrowsNamingThePathItCannotCreate) {
  TempDir tmp;
  const std::string blocker = tmp.write("file", "not a folder");
  const std::string dir = blocker + "/tb";
  try {
    TensorBoardWriter writer(dir);
    FAIL() << "no error for " << dir;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
  }
}

TEST(TensorBoardWriter, RecordsAndEventsDecodeByHand) {
  TempDir tmp;
  std::string path;
  {
    TensorBoardWriter writer(tmp.path());
    path = writer.path();
    writer.scalar("train/loss", 7, 2.5, 1700000000.25);
    writer.scalar("train/loss", -3, -0.1, 1700000001.5);  // a negative step: a ten-byte varint
    writer.text("recipe", 0, "model:\n  layers: 2 \xC2\xB5", 1700000002.0);
    writer.flush();
  }
  std::vector<std::string> records;
  ASSERT_NO_THROW(records = readRecords(path));
  ASSERT_EQ(records.size(), 4u);

  // Event{wall_time = 1 (double), file_version = 3}.
  const auto version = decode(records[0]);
  EXPECT_EQ(only(version, 3, 2).bytes, "brain.Event:2");
  EXPECT_GT(asDouble(only(version, 1, 1)), 1.5e9);  // now, in seconds since the epoch

  // Event{wall_time = 1, step = 2, summary = 5 {value = 1 {tag = 1, simple_value = 2 (float)}}}.
  const struct {
    int64_t step;
    double wallTime;
    float value;
  } expected[] = {{7, 1700000000.25, 2.5f}, {-3, 1700000001.5, -0.1f}};
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE("scalar " + std::to_string(i));
    const auto event = decode(records[1 + i]);
    EXPECT_EQ(asDouble(only(event, 1, 1)), expected[i].wallTime);
    EXPECT_EQ(static_cast<int64_t>(only(event, 2, 0).varint), expected[i].step);
    const auto value = decode(only(decode(only(event, 5, 2).bytes), 1, 2).bytes);
    EXPECT_EQ(only(value, 1, 2).bytes, "train/loss");
    EXPECT_EQ(asFloat(only(value, 2, 5)), expected[i].value);
  }

  // Summary.Value{tag = 1, tensor = 8 {dtype = 1: 7 (DT_STRING), tensor_shape = 2: empty, string_val = 8},
  // metadata = 9 {plugin_data = 1 {plugin_name = 1: "text"}}}.
  const auto event = decode(records[3]);
  EXPECT_EQ(static_cast<int64_t>(only(event, 2, 0).varint), 0);
  const auto value = decode(only(decode(only(event, 5, 2).bytes), 1, 2).bytes);
  EXPECT_EQ(only(value, 1, 2).bytes, "recipe");
  const auto tensor = decode(only(value, 8, 2).bytes);
  EXPECT_EQ(only(tensor, 1, 0).varint, 7u);
  EXPECT_EQ(only(tensor, 2, 2).bytes, "");
  EXPECT_EQ(only(tensor, 8, 2).bytes, "model:\n  layers: 2 \xC2\xB5");
  const auto pluginData = decode(only(decode(only(value, 9, 2).bytes), 1, 2).bytes);
  EXPECT_EQ(only(pluginData, 1, 2).bytes, "text");
}

TEST(TensorBoardWriter, TensorBoardReadsAResumedRun) {
  const std::string python = ptrain::test::pythonImporting("tensorboard");
  if (python.empty()) GTEST_SKIP() << ptrain::test::pythonLacks({"tensorboard"});
  const std::string script = ptrain::test::sourceDir() + "/tests/tools/read_tensorboard.py";
  ASSERT_TRUE(fs::exists(script)) << script << " not found";

  // Two writers in one folder, as a run and its resumption leave it: steps 1-5, then 6-10.
  // Values that float32 cannot hold exactly, a large one and a negative one.
  TempDir tmp;
  std::map<int64_t, double> loss, lr;
  const std::string recipe =
      "# Recipe\n\n| key | value |\n|---|---|\n| layers | 2 |\n\xE2\x9C\x93 \"quoted\" \\ tab\t.";
  for (int run = 0; run < 2; ++run) {
    TensorBoardWriter writer(tmp.path());
    if (run == 0) writer.text("recipe", 0, recipe, 1700000000.0);
    for (int64_t step = 1 + 5 * run; step <= 5 + 5 * run; ++step) {
      loss[step] = 10.0 / (3.0 * static_cast<double>(step)) - 1.0;
      lr[step] = 1e-4 * static_cast<double>(step) + 1e30 * (step == 10);
      writer.scalar("train/loss", step, loss[step], 1700000000.0 + static_cast<double>(step));
      writer.scalar("train/lr", step, lr[step], 1700000000.0 + static_cast<double>(step));
      writer.flush();
    }
  }
  ASSERT_EQ(eventFiles(tmp.path()).size(), 2u);

  const auto result = ptrain::test::runProcess({python, script, tmp.path()}, {}, 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // The JSON is the last line; anything before it is Python's chatter on stderr.
  std::string output = result.output;
  while (!output.empty() && output.back() == '\n') output.pop_back();
  const nlohmann::json read = nlohmann::json::parse(output.substr(output.rfind('\n') + 1));

  for (const auto& [tag, values] : {std::pair{"train/loss", &loss}, std::pair{"train/lr", &lr}}) {
    SCOPED_TRACE(tag);
    ASSERT_TRUE(read["scalars"].contains(tag)) << read.dump();
    const auto& points = read["scalars"][tag];
    ASSERT_EQ(points.size(), values->size()) << points.dump();
    auto expected = values->begin();
    for (const auto& point : points) {
      EXPECT_EQ(point[0].get<int64_t>(), expected->first);
      // TensorBoard keeps a simple_value as a float32, printed as the double of that float.
      EXPECT_EQ(point[1].get<double>(), static_cast<double>(static_cast<float>(expected->second)))
          << "step " << expected->first;
      ++expected;
    }
  }
  EXPECT_EQ(read["scalars"].size(), 2u) << read.dump();
  nlohmann::json texts;
  texts["recipe"] = nlohmann::json::array({nlohmann::json::array({0, recipe})});
  EXPECT_EQ(read["texts"], texts) << read.dump();
}

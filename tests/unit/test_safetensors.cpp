// Safetensors writer and reader: round trips of every dtype, the on-disk bytes
// checked by hand, files written by someone else, every kind of corruption,
// and an independent Python reader that shares no code with ptrain.
#include "ptrain/engine/safetensors.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::CheckpointError;
using ptrain::test::TempDir;

namespace {

// The 8-byte little-endian length, written out by hand.
std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

std::string rawFile(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

std::string writeRaw(const TempDir& dir, const std::string& name, const std::string& bytes) {
  std::string path = dir.path() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string fileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// The message of the CheckpointError that fn throws, or a note saying it did not.
template <typename Fn>
std::string errorOf(Fn&& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("other exception: ") + e.what();
  }
  return "no exception";
}

std::string loadError(const std::string& path) {
  return errorOf([&] { ptrain::loadSafetensors(path); });
}

struct Named {
  std::string name;
  at::Tensor tensor;
  const char* dtype;  // the format's name for it, spelled out by hand
};

// One tensor of every supported dtype with values at the edges of each type,
// plus 0-dim, empty and non-contiguous ones.
std::vector<Named> everyDtype() {
  std::vector<Named> out;
  out.push_back({"f64", at::tensor(std::vector<double>{1.5, -2.25, 3e300, -0.0}, at::kDouble), "F64"});
  // Transposed: the writer must store it in row-major order of its shape.
  out.push_back({"f32_t", at::arange(6, at::kFloat).reshape({2, 3}).t(), "F32"});
  out.push_back({"f16", at::tensor(std::vector<float>{0.5f, -1.0f, 65504.0f}).to(at::kHalf), "F16"});
  out.push_back({"bf16", at::tensor(std::vector<float>{1.0f, -0.5f, 3.0e38f, 7.0f}).to(at::kBFloat16).reshape({2, 2}),
                 "BF16"});
  out.push_back({"i64",
                 at::tensor(std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -1,
                                                 std::numeric_limits<int64_t>::max()},
                            at::kLong),
                 "I64"});
  out.push_back({"i32",
                 at::tensor(std::vector<int32_t>{std::numeric_limits<int32_t>::min(), 7,
                                                 std::numeric_limits<int32_t>::max()},
                            at::kInt),
                 "I32"});
  out.push_back({"i16", at::tensor(std::vector<int64_t>{-32768, 0, 32767}).to(at::kShort), "I16"});
  out.push_back({"i8", at::tensor(std::vector<int64_t>{-128, 1, 127}).to(at::kChar), "I8"});
  out.push_back({"u8", at::tensor(std::vector<int64_t>{0, 128, 255}).to(at::kByte), "U8"});
  out.push_back({"bool", at::tensor(std::vector<int64_t>{1, 0, 0, 1}).to(at::kBool).reshape({1, 4}), "BOOL"});
  out.push_back({"scalar", at::scalar_tensor(3.25, at::kFloat), "F32"});
  out.push_back({"empty", at::empty({0}, at::kFloat), "F32"});
  out.push_back({"empty3d", at::empty({2, 0, 3}, at::kLong), "I64"});
  // A view with a storage offset: only its own elements may be written.
  out.push_back({"slice", at::arange(10, at::kInt).slice(0, 3, 7), "I32"});
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> pairsOf(const std::vector<Named>& named) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& n : named) out.emplace_back(n.name, n.tensor);
  return out;
}

}  // namespace

TEST(SafetensorsRoundTrip, EveryDtypeShapeAndMetadata) {
  TempDir dir;
  const std::string path = dir.path() + "/model.safetensors";
  const auto named = everyDtype();
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"step", "42"}, {"note", "ünïcode ok"}};
  ptrain::saveSafetensors(path, pairsOf(named), meta);

  auto file = ptrain::loadSafetensors(path);
  fs::remove(path);  // the loaded tensors must own their memory
  EXPECT_EQ(file.path, path);
  EXPECT_EQ(file.metadata, meta);
  ASSERT_EQ(file.tensors.size(), named.size());
  for (const auto& n : named) {
    SCOPED_TRACE(n.name);
    ASSERT_TRUE(file.contains(n.name));
    const at::Tensor& got = file.get(n.name);
    EXPECT_EQ(got.scalar_type(), n.tensor.scalar_type());
    EXPECT_EQ(got.sizes(), n.tensor.sizes());
    EXPECT_EQ(got.device().type(), at::kCPU);
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_TRUE(at::equal(got, n.tensor));
  }
  // Spot checks against literal values, not only against the input tensors.
  EXPECT_EQ(file.get("i64")[0].item<int64_t>(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(file.get("f32_t")[2][1].item<float>(), 5.0f);  // element (1, 2) of the original
  EXPECT_EQ(file.get("slice")[0].item<int32_t>(), 3);
  EXPECT_EQ(file.get("scalar").dim(), 0);
  EXPECT_EQ(file.get("scalar").item<float>(), 3.25f);
  EXPECT_EQ(file.get("empty3d").sizes(), (std::vector<int64_t>{2, 0, 3}));
}

TEST(SafetensorsRoundTrip, NoTensorsAndNoMetadata) {
  TempDir dir;
  const std::string path = dir.path() + "/empty.safetensors";
  ptrain::saveSafetensors(path, {});
  // 8 bytes of length, then "{}" padded to 8 bytes.
  EXPECT_EQ(fileBytes(path), le64(8) + std::string("{}      "));
  auto file = ptrain::loadSafetensors(path);
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_TRUE(file.metadata.empty());
}

TEST(SafetensorsFormat, HeaderAndDataBytesByHand) {
  TempDir dir;
  const std::string path = dir.path() + "/x.safetensors";
  // Given out of name order: the file stores them sorted by name.
  ptrain::saveSafetensors(path,
                          {{"b", at::tensor(std::vector<float>{1.0f, -2.0f})},
                           {"c", at::scalar_tensor(7, at::kByte)},
                           {"a", at::tensor(std::vector<int64_t>{1, 2, 3}).to(at::kShort).reshape({1, 3})}},
                          {{"format", "pt"}, {"step", "12"}});
  const std::string bytes = fileBytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "header length " << n << " is not a multiple of 8";
  // Data: a = 3 x int16, b = 2 x float32, c = 1 x uint8.
  ASSERT_EQ(bytes.size(), 8 + n + 6 + 8 + 1);
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  size_t close = header.find_last_of('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(header.substr(close + 1), std::string(n - close - 1, ' '));

  const nlohmann::json expected = nlohmann::json::parse(R"({
    "a": {"dtype": "I16", "shape": [1, 3], "data_offsets": [0, 6]},
    "b": {"dtype": "F32", "shape": [2], "data_offsets": [6, 14]},
    "c": {"dtype": "U8", "shape": [], "data_offsets": [14, 15]},
    "__metadata__": {"format": "pt", "step": "12"}
  })");
  EXPECT_EQ(nlohmann::json::parse(header), expected);

  // 1, 2, 3 as int16 LE; 1.0f = 0x3f800000, -2.0f = 0xc0000000 LE; 7.
  const std::string data("\x01\x00\x02\x00\x03\x00"
                         "\x00\x00\x80\x3f\x00\x00\x00\xc0"
                         "\x07",
                         15);
  EXPECT_EQ(bytes.substr(8 + n), data);
}

TEST(SafetensorsFormat, ReadsAFileLaidOutDifferently) {
  // Written by hand the way another writer might: tensors in reverse name
  // order in the data, no padding, metadata first, an unknown entry key.
  TempDir dir;
  const std::string header =
      R"({"__metadata__":{"k":"v"},"x":{"dtype":"F64","shape":[1],"data_offsets":[4,12],"extra":1},)"
      R"("w":{"dtype":"I32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"BF16","shape":[0,5],"data_offsets":[12,12]}})";
  std::string data("\xfe\xff\xff\xff"                  // int32 -2
                   "\x00\x00\x00\x00\x00\x00\x04\x40",  // double 2.5
                   12);
  const std::string path = writeRaw(dir, "foreign.safetensors", rawFile(header, data));
  auto file = ptrain::loadSafetensors(path);
  EXPECT_EQ(file.metadata, (std::map<std::string, std::string>{{"k", "v"}}));
  ASSERT_EQ(file.tensors.size(), 3u);
  EXPECT_EQ(file.get("w").dim(), 0);
  EXPECT_EQ(file.get("w").item<int32_t>(), -2);
  EXPECT_EQ(file.get("x").scalar_type(), at::kDouble);
  EXPECT_EQ(file.get("x")[0].item<double>(), 2.5);
  EXPECT_EQ(file.get("e").scalar_type(), at::kBFloat16);
  EXPECT_EQ(file.get("e").sizes(), (std::vector<int64_t>{0, 5}));

  std::map<std::string, std::string> meta;
  auto entries = ptrain::readSafetensorsHeader(path, &meta);
  ASSERT_EQ(entries.size(), 3u);
  // Ascending data offset: w [0,4], x [4,12], e [12,12].
  EXPECT_EQ(entries[0].name, "w");
  EXPECT_EQ(entries[0].dtype, "I32");
  EXPECT_TRUE(entries[0].shape.empty());
  EXPECT_EQ(entries[1].name, "x");
  EXPECT_EQ(entries[1].begin, 4u);
  EXPECT_EQ(entries[1].end, 12u);
  EXPECT_EQ(entries[2].name, "e");
  EXPECT_EQ(entries[2].shape, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(meta.at("k"), "v");
}

TEST(SafetensorsCorrupt, FileLevelErrors) {
  TempDir dir;
  const std::string missing = dir.path() + "/nope.safetensors";
  EXPECT_EQ(loadError(missing), missing + ": file not found");

  const std::string tiny = writeRaw(dir, "tiny", std::string("\x10\x00\x00\x00\x00", 5));
  EXPECT_EQ(loadError(tiny),
            tiny + ": file is 5 bytes, too short for the 8-byte header length (truncated or not a safetensors file)");

  const std::string longHeader = writeRaw(dir, "long", le64(100) + "{}");
  EXPECT_EQ(loadError(longHeader),
            longHeader + ": header length 100 is larger than the 2 bytes that follow it (truncated or not a "
                         "safetensors file)");

  const std::string notObject = writeRaw(dir, "array", rawFile("[1, 2]  ", ""));
  EXPECT_EQ(loadError(notObject), notObject + ": header does not start with '{' (not a safetensors file)");

  const std::string badJson = writeRaw(dir, "badjson", rawFile(R"({"a": )", ""));
  const std::string err = loadError(badJson);
  const std::string prefix = badJson + ": header is not valid JSON ([json.exception.parse_error.101] parse error";
  EXPECT_EQ(err.substr(0, prefix.size()), prefix) << err;
  EXPECT_EQ(err.back(), ')') << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;

  const std::string dirPath = dir.path() + "/adir";
  fs::create_directory(dirPath);
  EXPECT_EQ(loadError(dirPath), dirPath + ": not a regular file");
}

TEST(SafetensorsCorrupt, TruncatedFiles) {
  TempDir dir;
  const std::string path = dir.path() + "/w.safetensors";
  ptrain::saveSafetensors(path, {{"w", at::ones({4}, at::kFloat)}});
  const std::string bytes = fileBytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  ASSERT_EQ(bytes.size(), 8 + n + 16);

  // Cut inside the data: the tensor runs past the 13 bytes that are left.
  fs::resize_file(path, bytes.size() - 3);
  EXPECT_EQ(loadError(path),
            path + ": tensor \"w\": data_offsets [0, 16] run past the end of the 13-byte data section (truncated "
                   "file?)");
  // Cut inside the header.
  fs::resize_file(path, 8 + n - 1);
  EXPECT_EQ(loadError(path), path + ": header length " + std::to_string(n) + " is larger than the " +
                                 std::to_string(n - 1) +
                                 " bytes that follow it (truncated or not a safetensors file)");
}

TEST(SafetensorsCorrupt, HeaderEntryErrors) {
  TempDir dir;
  struct Case {
    const char* header;
    size_t dataBytes;
    const char* error;  // after "<path>: "
  };
  const Case cases[] = {
      {R"({"x": 3})", 0, R"(tensor "x": entry is not a JSON object)"},
      {R"({"x": {"shape": [1], "data_offsets": [0, 4]}})", 4, R"(tensor "x": "dtype" missing or not a string)"},
      {R"({"x": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}})", 8,
       R"(tensor "x": unknown dtype "C64" (supported: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL))"},
      {R"({"x": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 4]}})", 4,
       R"(tensor "x": "shape" missing or not a list of non-negative integers)"},
      {R"({"x": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
       R"(tensor "x": "shape" missing or not a list of non-negative integers)"},
      {R"({"x": {"dtype": "F32", "data_offsets": [0, 4]}})", 4,
       R"(tensor "x": "shape" missing or not a list of non-negative integers)"},
      {R"({"x": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4,
       R"(tensor "x": shape [4294967296,4294967296] is too large)"},
      {R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4,
       R"(tensor "x": "data_offsets" missing or not two non-negative integers [begin, end])"},
      {R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4,
       R"(tensor "x": "data_offsets" missing or not two non-negative integers [begin, end])"},
      {R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8,
       R"(tensor "x": data_offsets [8, 4] end before they begin)"},
      {R"({"x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", 12,
       R"(tensor "x": data_offsets [0, 12] hold 12 bytes, but shape [2, 2] of F32 needs 16)"},
      {R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 12,
       R"(tensor "x": data_offsets [0, 16] run past the end of the 12-byte data section (truncated file?))"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, R"(tensors "a" and "b" overlap (data_offsets [0, 8] and [4, 12]))"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
       12, R"(data bytes [4, 8) belong to no tensor)"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 6, R"(data bytes [4, 6) belong to no tensor)"},
      {R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
           "a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
       2, R"(header names "a" twice)"},
      {R"({"__metadata__": {"k": 1}})", 0, R"("__metadata__" value of "k" is not a string)"},
      {R"({"__metadata__": ["k"]})", 0, R"("__metadata__" is not a JSON object)"},
  };
  int i = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.header);
    const std::string path = writeRaw(dir, "case" + std::to_string(i++), rawFile(c.header, std::string(c.dataBytes, '\0')));
    EXPECT_EQ(loadError(path), path + ": " + c.error);
    EXPECT_EQ(errorOf([&] { ptrain::readSafetensorsHeader(path); }), path + ": " + c.error);
  }
}

TEST(SafetensorsCorrupt, BoolBytesOtherThanZeroOrOne) {
  TempDir dir;
  const std::string path = writeRaw(dir, "flags", rawFile(R"({"flags": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}})",
                                                          std::string("\x01\x00\x01\x02", 4)));
  EXPECT_EQ(loadError(path), path + ": tensor \"flags\": BOOL element 3 is byte 2 (only 0 and 1 are valid)");
  // The header alone is fine.
  EXPECT_EQ(ptrain::readSafetensorsHeader(path).size(), 1u);
}

TEST(SafetensorsCorrupt, WriterRefusesBadInput) {
  TempDir dir;
  const std::string path = dir.path() + "/bad.safetensors";
  auto saveError = [&](std::vector<std::pair<std::string, at::Tensor>> tensors) {
    return errorOf([&] { ptrain::saveSafetensors(path, tensors); });
  };
  EXPECT_EQ(saveError({{"z", at::zeros({2}, at::kComplexFloat)}}),
            path + ": tensor \"z\" has dtype ComplexFloat, which safetensors cannot hold (supported: F64, F32, F16, "
                   "BF16, I64, I32, I16, I8, U8, BOOL)");
  EXPECT_EQ(saveError({{"a", at::zeros({1})}, {"a", at::zeros({1})}}), path + ": tensor name \"a\" appears twice");
  EXPECT_EQ(saveError({{"__metadata__", at::zeros({1})}}),
            path + ": \"__metadata__\" is reserved and cannot name a tensor");
  EXPECT_EQ(saveError({{"", at::zeros({1})}}), path + ": a tensor has an empty name");
  EXPECT_EQ(saveError({{"u", at::Tensor()}}), path + ": tensor \"u\" is undefined");
  const std::string noDir = dir.path() + "/missing/x.safetensors";
  EXPECT_EQ(errorOf([&] { ptrain::saveSafetensors(noDir, {{"a", at::zeros({1})}}); }),
            noDir + ": cannot create (No such file or directory)");
  EXPECT_EQ(errorOf([] { ptrain::safetensorsDtypeName(at::kComplexDouble); }),
            "dtype ComplexDouble cannot be stored in a safetensors file (supported: F64, F32, F16, BF16, I64, I32, "
            "I16, I8, U8, BOOL)");
  EXPECT_EQ(ptrain::safetensorsDtypeName(at::kBFloat16), "BF16");

  ptrain::saveSafetensors(path, {{"a", at::zeros({1})}});
  auto file = ptrain::loadSafetensors(path);
  EXPECT_EQ(errorOf([&] { file.get("nope"); }), path + ": no tensor \"nope\" (the file holds 1 tensors)");
}

// The file as an independent reader sees it: torch in Python parsing the
// header with json and the data with torch.frombuffer.
TEST(SafetensorsPython, IndependentReaderAgrees) {
  const std::string python = "/usr/bin/python3";
  auto probe = ptrain::test::runProcess({python, "-c", "import torch"}, {}, 60);
  if (probe.exit_code != 0) GTEST_SKIP() << "python3 cannot import torch: " << probe.output;

  TempDir dir;
  const std::string path = dir.path() + "/m.safetensors";
  // Values whose float64 sums are exact, so both sides must agree bit for bit.
  std::vector<Named> named;
  named.push_back({"f64", at::tensor(std::vector<double>{1.5, -2.25, 1024.0}), "F64"});
  named.push_back({"f32_t", at::arange(6, at::kFloat).reshape({2, 3}).t(), "F32"});
  named.push_back({"f16", at::tensor(std::vector<float>{0.5f, -1.0f, 2048.0f}).to(at::kHalf), "F16"});
  named.push_back({"bf16", at::tensor(std::vector<float>{1.0f, -0.5f, 256.0f, 7.0f}).to(at::kBFloat16).reshape({2, 2}),
                   "BF16"});
  named.push_back({"i64", at::tensor(std::vector<int64_t>{-5, 1LL << 40, 9}), "I64"});
  named.push_back({"i32", at::tensor(std::vector<int32_t>{-70000, 7, 70000}), "I32"});
  named.push_back({"i16", at::tensor(std::vector<int64_t>{-32768, 3, 32767}).to(at::kShort), "I16"});
  named.push_back({"i8", at::tensor(std::vector<int64_t>{-128, 1, 127}).to(at::kChar), "I8"});
  named.push_back({"u8", at::tensor(std::vector<int64_t>{0, 128, 255}).to(at::kByte), "U8"});
  named.push_back({"bool", at::tensor(std::vector<int64_t>{1, 0, 0, 1}).to(at::kBool), "BOOL"});
  named.push_back({"scalar", at::scalar_tensor(3.25, at::kFloat), "F32"});
  named.push_back({"empty3d", at::empty({2, 0, 3}, at::kLong), "I64"});
  named.push_back({"slice", at::arange(10, at::kInt).slice(0, 3, 7), "I32"});
  ptrain::saveSafetensors(path, pairsOf(named), {{"format", "pt"}, {"step", "7"}});

  const std::string script = ptrain::test::sourceDir() + "/tests/tools/read_safetensors.py";
  auto result = ptrain::test::runProcess({python, script, path}, {}, 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;

  std::map<std::string, std::vector<std::string>> lines;
  std::map<std::string, std::string> meta;
  std::istringstream in(result.output);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::istringstream ls(line);
    for (std::string f; std::getline(ls, f, '\t');) fields.push_back(f);
    if (line.back() == '\t') fields.push_back("");
    if (fields.size() == 3 && fields[0] == "meta") meta[fields[1]] = fields[2];
    else if (fields.size() == 6 && fields[0] == "tensor") lines[fields[1]] = fields;
    else ADD_FAILURE() << "unexpected reader line: " << line;
  }
  EXPECT_EQ(meta, (std::map<std::string, std::string>{{"format", "pt"}, {"step", "7"}}));
  ASSERT_EQ(lines.size(), named.size()) << result.output;
  for (const auto& n : named) {
    SCOPED_TRACE(n.name);
    ASSERT_EQ(lines.count(n.name), 1u);
    const auto& f = lines[n.name];
    EXPECT_EQ(f[2], n.dtype);
    std::string shape;
    for (int64_t d : n.tensor.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    EXPECT_EQ(f[3], shape);
    at::Tensor flat = n.tensor.reshape({-1}).to(at::kDouble);
    at::Tensor weights = at::arange(1, flat.numel() + 1, at::kDouble);
    EXPECT_EQ(std::stod(f[4]), flat.sum().item<double>());
    EXPECT_EQ(std::stod(f[5]), (flat * weights).sum().item<double>());
  }
  // One literal check, independent of torch on both sides: sum(0..5) = 15 and
  // the transposed order 0,3,1,4,2,5 weighted by 1..6 = 0+6+3+16+10+30 = 65.
  EXPECT_EQ(std::stod(lines["f32_t"][4]), 15.0);
  EXPECT_EQ(std::stod(lines["f32_t"][5]), 65.0);
}

// Megatron's indexed data set (datasets/indexed): the reader against
// hand-written .idx/.bin pairs, good and broken; the GPT samples against
// their own invariants and per-rank reading; and everything against
// megatron-core itself (tests/tools/megatron_indexed.py writes data sets with
// megatron's IndexedDatasetBuilder and dumps what megatron's GPTDataset and
// BlendedDataset make of them). The megatron suite runs where
// ptrain::test::testPython() has megatron-core (the PyPI suite) and skips,
// saying why, elsewhere.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <stdlib.h>
#include <sys/wait.h>

#include "ptrain/core/error.h"
#include "ptrain/datasets/indexed_dataset.h"
#include "support/test_support.h"

using ptrain::ConfigError;
using ptrain::datasets::BlendedGptSamples;
using ptrain::datasets::GptBlendOptions;
using ptrain::datasets::GptSampleOptions;
using ptrain::datasets::GptSamplePart;
using ptrain::datasets::GptSamples;
using ptrain::datasets::IndexedBinRead;
using ptrain::datasets::IndexedDataset;
using ptrain::datasets::IndexedDType;
using ptrain::datasets::MegatronSplit;
using ptrain::datasets::NumpyRandomState;

namespace fs = std::filesystem;

namespace {

// A fresh folder under the system's temp dir, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "ptrain_indexed_XXXXXX").string();
    char* made = ::mkdtemp(pattern.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

template <typename T>
void append(std::string& bytes, T value) {
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));
  bytes.append(raw, sizeof(T));
}

template <typename T>
void patch(std::string& bytes, size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

// A data set as megatron's _IndexWriter lays it out.
struct PairSpec {
  IndexedDType dtype = IndexedDType::kInt32;
  std::vector<std::vector<int64_t>> sequences;
  std::vector<int64_t> document_indices;  // empty: one document per sequence
  std::vector<int8_t> modes;              // non-empty: the multimodal block
};

void appendToken(std::string& bytes, IndexedDType dtype, int64_t v) {
  switch (dtype) {
    case IndexedDType::kUint8: append<uint8_t>(bytes, static_cast<uint8_t>(v)); break;
    case IndexedDType::kInt8: append<int8_t>(bytes, static_cast<int8_t>(v)); break;
    case IndexedDType::kInt16: append<int16_t>(bytes, static_cast<int16_t>(v)); break;
    case IndexedDType::kUint16: append<uint16_t>(bytes, static_cast<uint16_t>(v)); break;
    case IndexedDType::kInt32: append<int32_t>(bytes, static_cast<int32_t>(v)); break;
    case IndexedDType::kInt64: append<int64_t>(bytes, v); break;
    case IndexedDType::kFloat32: append<float>(bytes, static_cast<float>(v)); break;
    case IndexedDType::kFloat64: append<double>(bytes, static_cast<double>(v)); break;
  }
}

std::string idxBytes(const PairSpec& spec) {
  const int64_t size = ptrain::datasets::indexedDTypeSize(spec.dtype);
  std::vector<int64_t> documents = spec.document_indices;
  if (documents.empty()) {
    documents.resize(spec.sequences.size() + 1);
    std::iota(documents.begin(), documents.end(), int64_t{0});
  }
  std::string bytes("MMIDIDX\0\0", 9);
  append<uint64_t>(bytes, 1);
  append<uint8_t>(bytes, static_cast<uint8_t>(spec.dtype));
  append<uint64_t>(bytes, spec.sequences.size());
  append<uint64_t>(bytes, documents.size());
  for (const auto& s : spec.sequences) append<int32_t>(bytes, static_cast<int32_t>(s.size()));
  int64_t pointer = 0;
  for (const auto& s : spec.sequences) {
    append<int64_t>(bytes, pointer);
    pointer += static_cast<int64_t>(s.size()) * size;
  }
  for (int64_t d : documents) append<int64_t>(bytes, d);
  for (int8_t m : spec.modes) append<int8_t>(bytes, m);
  return bytes;
}

std::string binBytes(const PairSpec& spec) {
  std::string bytes;
  for (const auto& s : spec.sequences) {
    for (int64_t v : s) appendToken(bytes, spec.dtype, v);
  }
  return bytes;
}

void writeFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string writePair(const TempDir& dir, const std::string& name, const PairSpec& spec) {
  writeFile(dir / (name + ".idx"), idxBytes(spec));
  writeFile(dir / (name + ".bin"), binBytes(spec));
  return dir / name;
}

// Offsets of the .idx arrays for S sequences.
size_t pointerAt(size_t sequences, size_t i) { return 34 + 4 * sequences + 8 * i; }
size_t documentAt(size_t sequences, size_t k) { return 34 + 12 * sequences + 8 * k; }

// The ConfigError's message, or "" when opening succeeds.
std::string openError(const std::string& prefix) {
  try {
    IndexedDataset dataset(prefix);
  } catch (const ConfigError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
    return message;
  }
  return "";
}

PairSpec smallSpec() {
  PairSpec spec;
  spec.sequences = {{1, 2, 3}, {4, 5}, {6}, {7, 8, 9, 10}};
  return spec;
}

// Random documents of random lengths, for GPT samples.
PairSpec randomSpec(int64_t sequences, int64_t max_length, uint64_t seed, IndexedDType dtype = IndexedDType::kUint16) {
  std::mt19937_64 random(seed);
  PairSpec spec;
  spec.dtype = dtype;
  int64_t next = 1;
  for (int64_t i = 0; i < sequences; ++i) {
    const int64_t length = 1 + static_cast<int64_t>(random() % static_cast<uint64_t>(max_length));
    std::vector<int64_t> tokens;
    // Consecutive ids make every token's origin visible in a sample.
    for (int64_t k = 0; k < length; ++k) tokens.push_back(next++ % 60000);
    spec.sequences.push_back(tokens);
  }
  return spec;
}

}  // namespace

// ---------------------------------------------------------------------------
// The reader

TEST(IndexedDatasetFormat, ReadsEveryDType) {
  TempDir dir;
  const std::vector<std::pair<IndexedDType, std::vector<int64_t>>> cases = {
      {IndexedDType::kUint8, {0, 1, 200, 255}},
      {IndexedDType::kInt8, {-128, -1, 0, 127}},
      {IndexedDType::kInt16, {-32768, -5, 7, 32767}},
      {IndexedDType::kUint16, {0, 1, 50000, 65535}},
      {IndexedDType::kInt32, {-2147483647 - 1, 0, 100000, 2147483647}},
      {IndexedDType::kInt64, {-(int64_t{1} << 60), 0, int64_t{1} << 40, (int64_t{1} << 62) + 3}},
      {IndexedDType::kFloat32, {0, 3, 16777216, 42}},
      {IndexedDType::kFloat64, {0, 3, int64_t{1} << 52, 42}},
  };
  for (const auto& [dtype, values] : cases) {
    SCOPED_TRACE(ptrain::datasets::indexedDTypeName(dtype));
    PairSpec spec;
    spec.dtype = dtype;
    spec.sequences = {{values[0], values[1]}, {}, {values[2], values[3], values[1]}};
    spec.document_indices = {0, 2, 3};
    const std::string prefix = writePair(dir, std::string("d") + ptrain::datasets::indexedDTypeName(dtype), spec);
    IndexedDataset dataset(prefix);
    EXPECT_EQ(dataset.dtype(), dtype);
    EXPECT_EQ(dataset.sequenceCount(), 3);
    EXPECT_EQ(dataset.documentCount(), 2);
    EXPECT_EQ(dataset.documentIndex(1), 2);
    EXPECT_EQ(dataset.sequenceLength(1), 0);
    EXPECT_EQ(dataset.sequencePointer(2), 2 * dataset.itemSize());
    EXPECT_EQ(dataset.binBytes(), 5 * dataset.itemSize());
    EXPECT_FALSE(dataset.hasSequenceModes());
    EXPECT_EQ(dataset.read(0), spec.sequences[0]);
    EXPECT_TRUE(dataset.read(1).empty());
    EXPECT_EQ(dataset.read(2), spec.sequences[2]);
    EXPECT_EQ(dataset.read(2, 1, 1), std::vector<int64_t>{values[3]});
    EXPECT_EQ(dataset.bytesRead(), static_cast<uint64_t>(6 * dataset.itemSize()));
  }
}

TEST(IndexedDatasetFormat, OpensAnEmptySetAndMultimodalModes) {
  TempDir dir;
  PairSpec empty;
  IndexedDataset none(writePair(dir, "empty", empty));
  EXPECT_EQ(none.sequenceCount(), 0);
  EXPECT_EQ(none.documentCount(), 0);
  EXPECT_EQ(none.binBytes(), 0);

  PairSpec modes = smallSpec();
  modes.modes = {0, 1, 0, 2};
  IndexedDataset multimodal(writePair(dir, "modes", modes));
  EXPECT_TRUE(multimodal.hasSequenceModes());
  EXPECT_EQ(multimodal.sequenceMode(3), 2);
  EXPECT_EQ(multimodal.read(3), modes.sequences[3]);
}

TEST(IndexedDatasetFormat, RefusesBrokenFilesWithWhereAndHow) {
  TempDir dir;
  const PairSpec spec = smallSpec();
  const std::string good_idx = idxBytes(spec);
  const std::string good_bin = binBytes(spec);
  const size_t s = spec.sequences.size();
  struct Case {
    const char* name;
    std::string idx;
    std::string bin;
    std::vector<std::string> expected;  // parts of the message
  };
  std::vector<Case> cases;
  auto with = [&](auto&& change) {
    std::string idx = good_idx;
    change(idx);
    return idx;
  };
  cases.push_back({"magic", with([](std::string& b) { b[0] = 'X'; }), good_bin,
                   {"magic.idx: byte 0:", "XMIDIDX", "not megatron's index magic", "preprocess_data.py"}});
  cases.push_back({"short", good_idx.substr(0, 5), good_bin, {"short.idx: byte 0:", "only 5 bytes"}});
  cases.push_back({"header", good_idx.substr(0, 20), good_bin, {"header.idx: byte 20:", "ends inside the 34-byte header"}});
  cases.push_back({"version", with([](std::string& b) { patch<uint64_t>(b, 9, 2); }), good_bin,
                   {"version.idx: byte 9:", "version 2, expected 1"}});
  cases.push_back({"dtype", with([](std::string& b) { b[17] = 9; }), good_bin,
                   {"dtype.idx: byte 17:", "dtype code 9", "8 uint16"}});
  cases.push_back({"truncated", good_idx.substr(0, good_idx.size() - 3), good_bin,
                   {"truncated.idx: byte", "the file is truncated", "document indices"}});
  cases.push_back({"trailing", good_idx + std::string(11, '\0'), good_bin,
                   {"trailing.idx:", "trailing bytes"}});
  cases.push_back({"count", with([](std::string& b) { patch<uint64_t>(b, 18, uint64_t{1} << 60); }), good_bin,
                   {"count.idx: byte 18:", "sequence count 1152921504606846976 does not fit"}});
  cases.push_back({"length", with([](std::string& b) { patch<int32_t>(b, 34 + 4, -2); }), good_bin,
                   {"length.idx: byte 38:", "sequence 1 has length -2"}});
  cases.push_back({"outside", with([&](std::string& b) { patch<int64_t>(b, pointerAt(s, 3), 1000); }), good_bin,
                   {"outside.idx: byte " + std::to_string(pointerAt(s, 3)) + ":", "past the end of", "outside.bin (40 bytes)"}});
  cases.push_back({"overlap", with([&](std::string& b) { patch<int64_t>(b, pointerAt(s, 2), 4); }), good_bin,
                   {"overlap.idx: byte " + std::to_string(pointerAt(s, 2)) + ":", "before the end of the sequence before it"}});
  cases.push_back({"shortbin", good_idx, good_bin.substr(0, good_bin.size() - 4),
                   {"shortbin.idx: byte " + std::to_string(pointerAt(s, 3)) + ":", "past the end of", "truncated"}});
  cases.push_back({"longbin", good_idx, good_bin + "xxxx", {"longbin.bin: byte 40:", "is 44 bytes", "trailing data"}});
  cases.push_back({"docend", with([&](std::string& b) { patch<int64_t>(b, documentAt(s, 4), 3); }), good_bin,
                   {"docend.idx: byte " + std::to_string(documentAt(s, 4)) + ":", "not the sequence count 4"}});
  cases.push_back({"docstart", with([&](std::string& b) { patch<int64_t>(b, documentAt(s, 0), 1); }), good_bin,
                   {"docstart.idx: byte " + std::to_string(documentAt(s, 0)) + ":", "start at 1, not 0"}});
  cases.push_back({"docfall", with([&](std::string& b) { patch<int64_t>(b, documentAt(s, 2), 0); }), good_bin,
                   {"docfall.idx: byte " + std::to_string(documentAt(s, 2)) + ":", "document index 2 is 0"}});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    writeFile(dir / (std::string(c.name) + ".idx"), c.idx);
    writeFile(dir / (std::string(c.name) + ".bin"), c.bin);
    const std::string message = openError(dir / c.name);
    ASSERT_FALSE(message.empty()) << "opened a broken pair";
    for (const std::string& part : c.expected) {
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
    }
    EXPECT_NE(message.find("rebuild"), std::string::npos) << message;
  }
  const std::string missing = openError(dir / "nothing");
  EXPECT_NE(missing.find("nothing.idx: cannot open"), std::string::npos) << missing;
}

TEST(IndexedDatasetFormat, RefusesFractionalFloatTokensAndBadRanges) {
  TempDir dir;
  PairSpec spec;
  spec.dtype = IndexedDType::kFloat32;
  spec.sequences = {{1, 2}};
  std::string bin = binBytes(spec);
  patch<float>(bin, 4, 2.5f);
  writeFile(dir / "f.idx", idxBytes(spec));
  writeFile(dir / "f.bin", bin);
  IndexedDataset dataset(dir / "f");
  try {
    dataset.read(0);
    FAIL() << "read 2.5 as a token id";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("f.bin: byte 4: token 2.5 is not a whole number"), std::string::npos) << error.what();
  }
  EXPECT_THROW(dataset.read(1), std::out_of_range);
  EXPECT_THROW(dataset.read(0, 1, 2), std::out_of_range);
  EXPECT_THROW(dataset.read(0, 3, 0), std::out_of_range);
  EXPECT_EQ(dataset.read(0, 2, 0).size(), 0u);
}

// ---------------------------------------------------------------------------
// numpy and megatron numbers that need no megatron to check

TEST(IndexedDatasetNumpy, ShufflesAsRandomState) {
  // numpy.random.RandomState(seed).shuffle(numpy.arange(10)), numpy 2.4.
  std::vector<int32_t> a(10);
  std::iota(a.begin(), a.end(), 0);
  NumpyRandomState(1234).shuffle(a.data(), 10);
  EXPECT_EQ(a, (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  std::vector<uint32_t> b(10);
  std::iota(b.begin(), b.end(), 0u);
  NumpyRandomState(0).shuffle(b.data(), 10);
  EXPECT_EQ(b, (std::vector<uint32_t>{2, 8, 4, 9, 1, 6, 7, 3, 0, 5}));
}

TEST(IndexedDatasetSplit, MatchesMegatronsRounding) {
  using ptrain::datasets::megatronSplitRange;
  using Range = std::optional<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(megatronSplitRange("969,30,1", MegatronSplit::kTrain, 1000), Range(std::make_pair(0, 969)));
  EXPECT_EQ(megatronSplitRange("969,30,1", MegatronSplit::kValidation, 1000), Range(std::make_pair(969, 999)));
  EXPECT_EQ(megatronSplitRange("969,30,1", MegatronSplit::kTest, 1000), Range(std::make_pair(999, 1000)));
  EXPECT_EQ(megatronSplitRange("1,1,1", MegatronSplit::kValidation, 10), Range(std::make_pair(3, 7)));
  EXPECT_EQ(megatronSplitRange("98,1.5,.5", MegatronSplit::kTest, 333), Range(std::make_pair(331, 333)));
  EXPECT_EQ(megatronSplitRange("100,0,0", MegatronSplit::kValidation, 10), Range());
  EXPECT_EQ(megatronSplitRange("99", MegatronSplit::kTest, 10), Range());
  EXPECT_THROW(megatronSplitRange("1,2,3,4", MegatronSplit::kTrain, 10), ConfigError);
  EXPECT_THROW(megatronSplitRange("99,-1", MegatronSplit::kTrain, 10), ConfigError);
  EXPECT_THROW(megatronSplitRange("0,0,0", MegatronSplit::kTrain, 10), ConfigError);
  EXPECT_THROW(megatronSplitRange("1..2", MegatronSplit::kTrain, 10), ConfigError);
}

// ---------------------------------------------------------------------------
// GPT samples: invariants and per-rank reading

TEST(IndexedDatasetGpt, SamplesOverlapByOneTokenAcrossSequenceBoundaries) {
  TempDir dir;
  const PairSpec spec = randomSpec(120, 40, 11);
  auto dataset = std::make_shared<const IndexedDataset>(writePair(dir, "r", spec));
  GptSampleOptions options;
  options.sequence_length = 16;
  options.seed = 77;
  const int64_t begin = 10, end = 100;
  GptSamples samples(dataset, begin, end, 300, options);
  int64_t tokens = 0;
  for (int64_t i = begin; i < end; ++i) tokens += dataset->sequenceLength(i);
  EXPECT_EQ(samples.tokensPerEpoch(), tokens);
  EXPECT_EQ(samples.epochs(), ptrain::datasets::gptEpochsFor(tokens, 300, options));
  EXPECT_GE(samples.size(), 300);
  EXPECT_EQ(samples.size(), (samples.epochs() * tokens - 1) / 16);
  // Every epoch holds each sequence of the split once.
  std::vector<int32_t> sorted = samples.documentIndex();
  std::sort(sorted.begin(), sorted.end());
  for (size_t k = 0; k < sorted.size(); ++k) EXPECT_EQ(sorted[k], begin + static_cast<int64_t>(k) / samples.epochs());
  // The samples in sample-index order are windows of 17 over the document
  // index's token stream, each starting at the previous one's last token.
  std::vector<int64_t> stream;
  for (int32_t s : samples.documentIndex()) {
    for (int64_t v : spec.sequences[static_cast<size_t>(s)]) stream.push_back(v);
  }
  std::vector<int64_t> by_row(static_cast<size_t>(samples.size()));
  for (int64_t i = 0; i < samples.size(); ++i) by_row[static_cast<size_t>(samples.shuffleIndex(i))] = i;
  for (int64_t row = 0; row < samples.size(); ++row) {
    const std::vector<int64_t> sample = samples.sample(by_row[static_cast<size_t>(row)]);
    ASSERT_EQ(sample.size(), 17u);
    const auto start = stream.begin() + row * 16;
    ASSERT_TRUE(std::equal(sample.begin(), sample.end(), start)) << "row " << row;
  }
  // The shuffle is a permutation.
  std::vector<int64_t> shuffle(static_cast<size_t>(samples.size()));
  for (int64_t i = 0; i < samples.size(); ++i) shuffle[static_cast<size_t>(i)] = samples.shuffleIndex(i);
  std::sort(shuffle.begin(), shuffle.end());
  for (int64_t i = 0; i < samples.size(); ++i) EXPECT_EQ(shuffle[static_cast<size_t>(i)], i);
}

TEST(IndexedDatasetGpt, ARankReadsOnlyTheSequencesOfItsSamples) {
  TempDir dir;
  const PairSpec spec = randomSpec(2000, 300, 5, IndexedDType::kInt32);
  auto dataset = std::make_shared<IndexedDataset>(writePair(dir, "big", spec));
  std::vector<IndexedBinRead> reads;
  dataset->setReadObserver([&](const IndexedBinRead& read) { reads.push_back(read); });
  GptSampleOptions options;
  options.sequence_length = 64;
  options.seed = 3;
  GptSamples samples(dataset, 0, dataset->sequenceCount(), 20000, options);
  ASSERT_GT(samples.size(), 200);
  EXPECT_EQ(dataset->bytesRead(), 0u) << "building the indices reads no token";

  // Rank 3 of 8 reads its contiguous share of the first 800 samples.
  const int64_t a = 3 * 100, b = 4 * 100;
  // The byte ranges those samples cover, from the indices alone: sample i
  // runs from row shuffle[i] to row shuffle[i] + 1 of the sample index.
  std::map<int64_t, std::pair<int64_t, int64_t>> allowed;  // sequence -> bytes
  int64_t expected_bytes = 0;
  for (int64_t i = a; i < b; ++i) {
    const int64_t row = samples.shuffleIndex(i);
    const auto [first, first_offset] = samples.sampleIndex(row);
    const auto [last, last_offset] = samples.sampleIndex(row + 1);
    for (int64_t k = first; k <= last; ++k) {
      const int64_t sequence = samples.documentIndex()[static_cast<size_t>(k)];
      const int64_t from = k == first ? first_offset : 0;
      const int64_t to = k == last ? last_offset + 1 : dataset->sequenceLength(sequence);
      const int64_t base = dataset->sequencePointer(sequence);
      auto& range = allowed.try_emplace(sequence, base + from * 4, base + to * 4).first->second;
      range.first = std::min(range.first, base + from * 4);
      range.second = std::max(range.second, base + to * 4);
      expected_bytes += (to - from) * 4;
    }
  }
  for (int64_t i = a; i < b; ++i) samples.sample(i);
  EXPECT_EQ(dataset->bytesRead(), static_cast<uint64_t>(expected_bytes));
  for (const IndexedBinRead& read : reads) {
    const auto it = allowed.find(read.sequence);
    ASSERT_NE(it, allowed.end()) << "read sequence " << read.sequence << ", which no sample of the rank covers";
    EXPECT_GE(read.begin, it->second.first);
    EXPECT_LE(read.end, it->second.second);
    EXPECT_GE(read.begin, dataset->sequencePointer(read.sequence));
    EXPECT_LE(read.end, dataset->sequencePointer(read.sequence) + 4 * dataset->sequenceLength(read.sequence));
  }
  // A rank's share is a small part of the file.
  EXPECT_LT(dataset->bytesRead() * 20, static_cast<uint64_t>(dataset->binBytes()));
}

TEST(IndexedDatasetGpt, RefusesWhatMegatronCannotBuild) {
  TempDir dir;
  auto dataset = std::make_shared<const IndexedDataset>(writePair(dir, "s", smallSpec()));
  GptSampleOptions options;
  options.sequence_length = 1;
  EXPECT_THROW(GptSamples(dataset, 0, 4, 10, options), ConfigError);
  options.sequence_length = 4;
  EXPECT_THROW(GptSamples(dataset, 2, 3, 10, options), ConfigError);  // one token
  EXPECT_THROW(GptSamples(dataset, 0, 5, 10, options), ConfigError);
  EXPECT_THROW(GptSamples::forSplit(dataset, "100,0,0", MegatronSplit::kValidation, 1, options), ConfigError);
  GptBlendOptions blend;
  blend.samples = options;
  blend.split = "1,0,0";
  EXPECT_THROW(BlendedGptSamples({dataset, dataset}, {1.0}, MegatronSplit::kTrain, 4, blend), ConfigError);
  EXPECT_THROW(BlendedGptSamples({dataset, dataset}, {1.0, 0.0}, MegatronSplit::kTrain, 4, blend), ConfigError);
  EXPECT_THROW(BlendedGptSamples({dataset, dataset}, {1.0, 1.0}, MegatronSplit::kTrain, std::nullopt, blend),
               ConfigError);
}

// ---------------------------------------------------------------------------
// Against megatron-core

namespace {

std::string sourceDirectory() {
#ifdef PTRAIN_SOURCE_DIR
  return PTRAIN_SOURCE_DIR;
#else
  return fs::absolute(__FILE__).parent_path().parent_path().parent_path().string();
#endif
}

std::string shellQuoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

template <typename T>
std::vector<int64_t> widened(const std::vector<T>& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

}  // namespace

class IndexedDatasetMegatron : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string lacks = ptrain::test::pythonLacks({"megatron.core"});
    if (!lacks.empty()) {
      skip_ = lacks;
      return;
    }
    const std::string python = ptrain::test::testPython();
    dir_ = new TempDir();
    const std::string script = sourceDirectory() + "/tests/tools/megatron_indexed.py";
    const std::string log = *dir_ / "megatron.log";
    const int status = std::system((shellQuoted(python) + " -W ignore " + shellQuoted(script) + " " +
                                    shellQuoted(*dir_ / "") + " >" + shellQuoted(log) + " 2>&1")
                                       .c_str());
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
      skip_ = "megatron-core could not be used by " + python + " (see " + log + ")";
      return;
    }
    if (status != 0) {
      std::ifstream in(log);
      std::stringstream text;
      text << in.rdbuf();
      failure_ = "tests/tools/megatron_indexed.py failed:\n" + text.str();
      return;
    }
    std::ifstream in(*dir_ / "megatron.json");
    result_ = new nlohmann::json(nlohmann::json::parse(in));
  }
  static void TearDownTestSuite() {
    delete result_;
    result_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(failure_.empty()) << failure_;
  }
  const nlohmann::json& result() const { return *result_; }
  std::string path(const std::string& name) const { return *dir_ / name; }

  std::shared_ptr<const IndexedDataset> open(const std::string& name) {
    auto& slot = opened_[name];
    if (!slot) slot = std::make_shared<const IndexedDataset>(path(name));
    return slot;
  }

  static void expectSameGpt(const GptSamples& ours, const nlohmann::json& theirs) {
    EXPECT_EQ(ours.beginSequence(), theirs["begin"].get<int64_t>());
    EXPECT_EQ(ours.endSequence(), theirs["end"].get<int64_t>());
    EXPECT_EQ(ours.tokensPerEpoch(), theirs["tokens_per_epoch"].get<int64_t>());
    EXPECT_EQ(ours.epochs(), theirs["epochs"].get<int64_t>());
    if (theirs["num_samples"].is_null()) {
      EXPECT_FALSE(ours.requestedSamples().has_value());
    } else {
      EXPECT_EQ(ours.requestedSamples(), std::optional<int64_t>(theirs["num_samples"].get<int64_t>()));
    }
    ASSERT_EQ(ours.size(), theirs["size"].get<int64_t>());
    EXPECT_EQ(widened(ours.documentIndex()), theirs["document_index"].get<std::vector<int64_t>>());
    std::vector<int64_t> sample_index, shuffle_index;
    for (int64_t row = 0; row <= ours.size(); ++row) {
      sample_index.push_back(ours.sampleIndex(row).first);
      sample_index.push_back(ours.sampleIndex(row).second);
    }
    for (int64_t i = 0; i < ours.size(); ++i) shuffle_index.push_back(ours.shuffleIndex(i));
    EXPECT_EQ(sample_index, theirs["sample_index"].get<std::vector<int64_t>>());
    EXPECT_EQ(shuffle_index, theirs["shuffle_index"].get<std::vector<int64_t>>());
    const auto& samples = theirs["samples"];
    for (int64_t i = 0; i < ours.size(); ++i) {
      ASSERT_EQ(ours.sample(i), samples[static_cast<size_t>(i)].get<std::vector<int64_t>>())
          << theirs["prefix"] << " " << theirs["split"] << " sample " << i;
    }
  }

  static inline std::string skip_;
  static inline std::string failure_;
  static inline TempDir* dir_ = nullptr;
  static inline nlohmann::json* result_ = nullptr;
  std::map<std::string, std::shared_ptr<const IndexedDataset>> opened_;
};

TEST_F(IndexedDatasetMegatron, ReadsTheFilesMegatronWrites) {
  std::cout << "[ megatron ] megatron-core " << result()["megatron_core_version"].get<std::string>() << ", numpy "
            << result()["numpy_version"].get<std::string>() << "\n";
  for (const auto& [name, theirs] : result()["files"].items()) {
    SCOPED_TRACE(name);
    const auto dataset = open(name);
    EXPECT_EQ(ptrain::datasets::indexedDTypeName(dataset->dtype()), theirs["dtype"].get<std::string>());
    const auto lengths = theirs["sequence_lengths"].get<std::vector<int64_t>>();
    const auto pointers = theirs["sequence_pointers"].get<std::vector<int64_t>>();
    const auto documents = theirs["document_indices"].get<std::vector<int64_t>>();
    ASSERT_EQ(dataset->sequenceCount(), static_cast<int64_t>(lengths.size()));
    ASSERT_EQ(dataset->documentCount() + 1, static_cast<int64_t>(documents.size()));
    for (int64_t i = 0; i < dataset->sequenceCount(); ++i) {
      EXPECT_EQ(dataset->sequenceLength(i), lengths[static_cast<size_t>(i)]);
      EXPECT_EQ(dataset->sequencePointer(i), pointers[static_cast<size_t>(i)]);
    }
    for (int64_t d = 0; d <= dataset->documentCount(); ++d) {
      EXPECT_EQ(dataset->documentIndex(d), documents[static_cast<size_t>(d)]);
    }
    const auto& sequences = theirs["sequences"];
    for (size_t i = 0; i < sequences.size(); ++i) {
      EXPECT_EQ(dataset->read(static_cast<int64_t>(i)), sequences[i].get<std::vector<int64_t>>()) << "sequence " << i;
    }
  }
}

TEST_F(IndexedDatasetMegatron, SplitsShufflesSumsAndBlendingIndicesMatch) {
  for (const auto& row : result()["split_ranges"]) {
    const auto split = row["split"].get<std::string>();
    const auto count = row["count"].get<int64_t>();
    for (int k = 0; k < 3; ++k) {
      const auto ours = ptrain::datasets::megatronSplitRange(split, static_cast<MegatronSplit>(k), count);
      const auto& theirs = row["ranges"][static_cast<size_t>(k)];
      if (theirs.is_null()) {
        EXPECT_FALSE(ours.has_value()) << split << " " << count << " split " << k;
      } else {
        ASSERT_TRUE(ours.has_value()) << split << " " << count << " split " << k;
        EXPECT_EQ(ours->first, theirs[0].get<int64_t>()) << split << " " << count << " split " << k;
        EXPECT_EQ(ours->second, theirs[1].get<int64_t>()) << split << " " << count << " split " << k;
      }
    }
  }
  for (const auto& shuffle : result()["shuffles"]) {
    const auto n = shuffle["n"].get<int64_t>();
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t{0});
    NumpyRandomState(shuffle["seed"].get<uint32_t>()).shuffle(order.data(), n);
    EXPECT_EQ(order, shuffle["order"].get<std::vector<int64_t>>()) << "seed " << shuffle["seed"] << " n " << n;
  }
  for (const auto& sum : result()["sums"]) {
    const auto values = sum["values"].get<std::vector<double>>();
    EXPECT_EQ(ptrain::datasets::numpySum(values.data(), static_cast<int64_t>(values.size())), sum["sum"].get<double>())
        << values.size() << " values";
  }
  for (const auto& row : result()["blend_sizes"]) {
    EXPECT_EQ(ptrain::datasets::megatronBlendSizes(row["weights"].get<std::vector<double>>(),
                                                   row["target"].get<int64_t>(), row["surplus"].get<double>()),
              row["sizes"].get<std::vector<int64_t>>());
  }
  for (const auto& row : result()["blending"]) {
    std::vector<int16_t> dataset_index;
    std::vector<int64_t> dataset_sample_index;
    ptrain::datasets::buildBlendingIndices(row["weights"].get<std::vector<double>>(), row["size"].get<int64_t>(),
                                           &dataset_index, &dataset_sample_index);
    EXPECT_EQ(widened(dataset_index), row["dataset_index"].get<std::vector<int64_t>>());
    EXPECT_EQ(dataset_sample_index, row["dataset_sample_index"].get<std::vector<int64_t>>());
  }
}

TEST_F(IndexedDatasetMegatron, GptAndBlendedSamplesMatch) {
  bool separated = false, merged = false;
  for (const auto& c : result()["cases"]) {
    const auto name = c["name"].get<std::string>();
    std::vector<std::shared_ptr<const IndexedDataset>> datasets;
    for (const auto& prefix : c["prefixes"]) datasets.push_back(open(prefix.get<std::string>()));
    const std::vector<double> weights =
        c["weights"].is_null() ? std::vector<double>{} : c["weights"].get<std::vector<double>>();
    GptBlendOptions options;
    options.split = c["split"].get<std::string>();
    options.mid_level_dataset_surplus = c["mid_level_dataset_surplus"].get<double>();
    options.samples.sequence_length = c["sequence_length"].get<int64_t>();
    options.samples.seed = c["seed"].get<uint32_t>();
    options.samples.add_extra_token_to_sequence = c["add_extra_token_to_sequence"].get<bool>();
    for (int k = 0; k < 3; ++k) {
      const auto split = static_cast<MegatronSplit>(k);
      SCOPED_TRACE(name + " " + ptrain::datasets::megatronSplitName(split));
      const auto& theirs = c["splits"][static_cast<size_t>(k)];
      if (theirs.is_null()) {
        EXPECT_FALSE(ptrain::datasets::megatronSplitRange(options.split, split, 10).has_value());
        continue;
      }
      options.samples.drop_last_partial_sequence =
          split != MegatronSplit::kValidation || c["drop_last_partial_validation_sequence"].get<bool>();
      const auto& size = c["sizes"][static_cast<size_t>(k)];
      const std::optional<int64_t> num_samples =
          size.is_null() ? std::nullopt : std::optional<int64_t>(size.get<int64_t>());
      BlendedGptSamples ours(datasets, weights, split, num_samples, options);
      if (theirs["kind"] == "gpt") {
        ASSERT_EQ(ours.datasetCount(), 1);
        expectSameGpt(ours.dataset(0), theirs);
      } else {
        ASSERT_EQ(ours.datasetCount(), static_cast<int64_t>(theirs["datasets"].size()));
        for (int64_t d = 0; d < ours.datasetCount(); ++d) {
          expectSameGpt(ours.dataset(d), theirs["datasets"][static_cast<size_t>(d)]);
        }
        ASSERT_EQ(ours.size(), theirs["size"].get<int64_t>());
        std::vector<int64_t> dataset_index, dataset_sample_index;
        for (int64_t i = 0; i < ours.size(); ++i) {
          dataset_index.push_back(ours.datasetOf(i));
          dataset_sample_index.push_back(ours.datasetSampleOf(i));
        }
        EXPECT_EQ(dataset_index, theirs["dataset_index"].get<std::vector<int64_t>>());
        EXPECT_EQ(dataset_sample_index, theirs["dataset_sample_index"].get<std::vector<int64_t>>());
        for (int64_t i = 0; i < ours.size(); ++i) {
          const auto& from = theirs["datasets"][static_cast<size_t>(dataset_index[static_cast<size_t>(i)])];
          ASSERT_EQ(ours.sample(i), from["samples"][static_cast<size_t>(dataset_sample_index[static_cast<size_t>(i)])]
                                        .get<std::vector<int64_t>>())
              << "blended sample " << i;
        }
      }
      for (int64_t d = 0; d < ours.datasetCount(); ++d) {
        if (ours.dataset(d).epochs() > 1) (ours.dataset(d).separateFinalEpoch() ? separated : merged) = true;
      }
    }
  }
  // The cases cover both ways megatron orders a final epoch.
  EXPECT_TRUE(separated);
  EXPECT_TRUE(merged);
}

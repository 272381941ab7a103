// CriteoDataset and CriteoWriter: the parse of hand-written lines against
// hand-computed values, the write/read round trip bit for bit, random access
// into gzip and plain files (and what it reads), the index's life cycle, and
// every malformed input refused with its file and line.
#include "ptrain/datasets/criteo_dataset.h"

#include "ptrain/core/error.h"
#include "ptrain/datasets/splitmix.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;
using namespace ptrain::datasets;

namespace {

// The index header's size (criteo_dataset.h); the access point table follows it.
constexpr size_t kIndexHeaderBytes = 80;

// A fresh folder per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "ptrain-criteo-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// One gzip member of `text`, as the gzip tool would write it.
std::string gzipped(const std::string& text) {
  z_stream strm{};
  EXPECT_EQ(deflateInit2(&strm, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&strm, text.size()) + 64, '\0');
  strm.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  strm.avail_in = static_cast<uInt>(text.size());
  strm.next_out = reinterpret_cast<Bytef*>(out.data());
  strm.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&strm, Z_FINISH), Z_STREAM_END);
  out.resize(strm.total_out);
  deflateEnd(&strm);
  return out;
}

// Sizes from 7 rows up, so ids and hashes of every width are exercised.
std::vector<int64_t> tableSizes() {
  std::vector<int64_t> sizes(kCriteoSparseFeatures);
  for (int64_t t = 0; t < kCriteoSparseFeatures; ++t) sizes[t] = t == 0 ? 7 : 1000 + 997 * t;
  sizes[1] = 5000;  // the item table
  return sizes;
}

CriteoOptions options() {
  CriteoOptions o;
  o.table_sizes = tableSizes();
  o.item_feature = 1;
  return o;
}

// A line of 40 columns: label "0", every count "1", every id "00000001",
// then `history` columns, with `changes` applied (column number -> text).
std::string line(const std::vector<std::pair<int, std::string>>& changes = {},
                 const std::vector<std::string>& history = {}) {
  std::vector<std::string> fields(kCriteoBaseColumns);
  fields[0] = "0";
  for (int64_t c = 1; c <= kCriteoDenseFeatures; ++c) fields[c] = "1";
  for (int64_t c = kCriteoDenseFeatures + 1; c < kCriteoBaseColumns; ++c) fields[c] = "00000001";
  fields.insert(fields.end(), history.begin(), history.end());
  for (const auto& [column, text] : changes) fields[column] = text;
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) out += (i ? "\t" : "") + fields[i];
  return out + "\n";
}

float logCount(int64_t count) { return static_cast<float>(std::log1p(static_cast<double>(count))); }

uint32_t bitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}

struct Sample {
  std::array<int64_t, kCriteoSparseFeatures> sparse{};
  std::array<int64_t, kCriteoDenseFeatures> counts{};
  std::vector<int64_t> history;
  int64_t history_length = 0;
  float label = 0;
};

// Samples in the recommender's shape: ids below their table, heavy-tailed
// counts (some zero), up to H history items.
std::vector<Sample> samples(int64_t n, int64_t historyLength, uint64_t seed) {
  const std::vector<int64_t> sizes = tableSizes();
  SplitMix64 rng(seed);
  std::vector<Sample> out(static_cast<size_t>(n));
  for (Sample& s : out) {
    for (int64_t t = 0; t < kCriteoSparseFeatures; ++t) s.sparse[t] = static_cast<int64_t>(rng.below(sizes[t]));
    for (int64_t k = 0; k < kCriteoDenseFeatures; ++k) {
      s.counts[k] = rng.below(4) == 0 ? 0 : static_cast<int64_t>(std::floor(std::exp(rng.unit() * 16)));
    }
    s.history.assign(static_cast<size_t>(historyLength), -1);
    s.history_length = historyLength ? static_cast<int64_t>(rng.below(historyLength + 1)) : 0;
    for (int64_t k = 0; k < s.history_length; ++k) s.history[k] = static_cast<int64_t>(rng.below(sizes[1]));
    s.label = rng.below(4) == 0 ? 1.0f : 0.0f;
  }
  return out;
}

void writeSamples(const std::string& path, const std::vector<Sample>& all, CriteoWriterOptions writerOptions) {
  CriteoWriter writer(path, writerOptions);
  for (const Sample& s : all) writer.writeSample(s);
  writer.commit();
}

// Rows [from, from + count) of `all` equal rows [0, count) of `examples`.
void expectRowsEqual(const CriteoExamples& all, int64_t from, const CriteoExamples& part) {
  const int64_t h = all.history_length;
  ASSERT_EQ(part.history_length, h);
  for (int64_t i = 0; i < part.count; ++i) {
    const int64_t r = from + i;
    ASSERT_EQ(part.labels[i], all.labels[r]) << "record " << r;
    ASSERT_EQ(part.history_lengths[i], all.history_lengths[r]) << "record " << r;
    for (int64_t t = 0; t < kCriteoSparseFeatures; ++t) {
      ASSERT_EQ(part.sparse[i * kCriteoSparseFeatures + t], all.sparse[r * kCriteoSparseFeatures + t])
          << "record " << r;
    }
    for (int64_t k = 0; k < kCriteoDenseFeatures; ++k) {
      ASSERT_EQ(bitsOf(part.dense[i * kCriteoDenseFeatures + k]), bitsOf(all.dense[r * kCriteoDenseFeatures + k]))
          << "record " << r;
    }
    for (int64_t k = 0; k < h; ++k) ASSERT_EQ(part.history[i * h + k], all.history[r * h + k]) << "record " << r;
  }
}

// Where each line starts, found the plain way, plus the text's end.
std::vector<uint64_t> lineStarts(const std::string& text) {
  std::vector<uint64_t> starts{0};
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n') starts.push_back(i + 1);
  }
  if (starts.back() != text.size()) starts.push_back(text.size());
  return starts;
}

}  // namespace

// ---- parse ----

TEST(CriteoDatasetParse, HandWrittenLinesGiveHandComputedValues) {
  TempDir dir;
  const std::string path = dir.file("day_0");
  std::string text;
  // Line 1: counts 5, missing, -3 (to 0), 0, 1..8, 100; ids 0xa, missing, 0xffffffff; label 1.
  text += line(
      {{0, "1"}, {1, "5"}, {2, ""}, {3, "-3"}, {4, "0"}, {13, "100"}, {14, "0000000a"}, {15, ""}, {16, "ffffffff"}});
  // Line 2: every feature missing, "\r\n" line end.
  std::vector<std::pair<int, std::string>> empty;
  for (int c = 1; c < kCriteoBaseColumns; ++c) empty.emplace_back(c, "");
  std::string second = line(empty);
  second.insert(second.size() - 1, "\r");
  text += second;
  writeBytes(path, text);

  CriteoDataset data(path, options());
  ASSERT_EQ(data.recordCount(), 2);
  EXPECT_EQ(data.historyLength(), 0);
  const CriteoExamples ex = data.readRecords(0, 2);
  ASSERT_EQ(ex.count, 2);
  EXPECT_EQ(ex.labels[0], 1.0f);
  EXPECT_EQ(ex.labels[1], 0.0f);
  // log(1 + 5), log(1 + 0) for missing and for -3, log(1 + 0), log(1 + 1) ...
  EXPECT_EQ(ex.dense[0], static_cast<float>(std::log1p(5.0)));
  EXPECT_FLOAT_EQ(ex.dense[0], 1.7917595f);
  EXPECT_EQ(ex.dense[1], 0.0f);
  EXPECT_EQ(ex.dense[2], 0.0f);
  EXPECT_EQ(ex.dense[3], 0.0f);
  EXPECT_EQ(ex.dense[4], static_cast<float>(std::log1p(1.0)));
  EXPECT_EQ(ex.dense[12], static_cast<float>(std::log1p(100.0)));
  // 0xa % 7 = 3; missing -> row 0; 0xffffffff = 4294967295 = 1434524 * 2994 + 2439.
  EXPECT_EQ(ex.sparse[0], 3);
  EXPECT_EQ(ex.sparse[1], kCriteoMissingCategoryRow);
  EXPECT_EQ(tableSizes()[2], 2994);
  EXPECT_EQ(ex.sparse[2], 2439);
  EXPECT_EQ(ex.sparse[3], 1);
  for (int64_t k = 0; k < kCriteoDenseFeatures; ++k) EXPECT_EQ(ex.dense[kCriteoDenseFeatures + k], 0.0f);
  for (int64_t t = 0; t < kCriteoSparseFeatures; ++t) EXPECT_EQ(ex.sparse[kCriteoSparseFeatures + t], 0);
  EXPECT_TRUE(ex.history.empty());
  EXPECT_EQ(ex.history_lengths, (std::vector<int64_t>{0, 0}));
}

TEST(CriteoDatasetParse, HexPastTheTableIsHashedModuloItsSize) {
  TempDir dir;
  const std::string path = dir.file("wide.tsv");
  // 16 digits (the largest 64-bit value), upper case, leading zeros, past 32 bits.
  writeBytes(
      path,
      line({{14, "FFFFFFFFFFFFFFFF"}, {15, "123456789AbCdEf0"}, {16, "0000000000000000000000ff"}, {17, "100000000"}}));
  CriteoDataset data(path, options());
  const CriteoExamples ex = data.readRecords(0, 1);
  const std::vector<int64_t> sizes = tableSizes();
  EXPECT_EQ(ex.sparse[0], static_cast<int64_t>(0xFFFFFFFFFFFFFFFFULL % 7));  // 18446744073709551615 % 7 = 1
  EXPECT_EQ(ex.sparse[0], 1);
  EXPECT_EQ(ex.sparse[1], static_cast<int64_t>(0x123456789ABCDEF0ULL % 5000));
  EXPECT_EQ(ex.sparse[1], 320);  // 1311768467463790320 % 5000
  EXPECT_EQ(ex.sparse[2], 255 % sizes[2]);
  EXPECT_EQ(ex.sparse[3], static_cast<int64_t>(0x100000000ULL % static_cast<uint64_t>(sizes[3])));
}

TEST(CriteoDatasetParse, HistoryColumnsHashIntoTheItemTable) {
  TempDir dir;
  const std::string path = dir.file("history.tsv");
  writeBytes(path, line({}, {"a", "ffffffff", "", ""}) + line({}, {"", "", "", ""}) + line({}, {"1", "2", "3", "4"}));
  CriteoDataset data(path, options());
  EXPECT_EQ(data.fileHistoryColumns(), 4);
  ASSERT_EQ(data.historyLength(), 4);
  const CriteoExamples ex = data.readRecords(0, 3);
  EXPECT_EQ(ex.history_lengths, (std::vector<int64_t>{2, 0, 4}));
  // 0xffffffff = 4294967295 = 858993 * 5000 + 2295.
  EXPECT_EQ(ex.history, (std::vector<int64_t>{10, 2295, -1, -1, -1, -1, -1, -1, 1, 2, 3, 4}));

  // A 40-column file gives an empty history of the asked length.
  const std::string plain = dir.file("plain.tsv");
  writeBytes(plain, line() + line());
  CriteoOptions o = options();
  o.history_length = 3;
  CriteoDataset without(plain, o);
  const CriteoExamples none = without.readRecords(0, 2);
  EXPECT_EQ(none.history, std::vector<int64_t>(6, -1));
  EXPECT_EQ(none.history_lengths, (std::vector<int64_t>{0, 0}));

  // A file whose history has another width than asked is refused at open.
  o.history_length = 8;
  try {
    CriteoDataset wrong(path, o);
    FAIL() << "a 44-column file opened with history_length 8";
  } catch (const ptrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":1: 44 columns give 4 history slots"), std::string::npos) << e.what();
  }
}

// ---- the round trip ----

class CriteoDatasetRoundTrip : public ::testing::TestWithParam<bool> {};

TEST_P(CriteoDatasetRoundTrip, WrittenSamplesReadBackBitForBit) {
  const bool gzip = GetParam();
  TempDir dir;
  const int64_t h = 6;
  const std::vector<Sample> all = samples(3000, h, 17);
  const std::string path = dir.file(gzip ? "round.tsv.gz" : "round.tsv");
  CriteoWriterOptions writerOptions;
  writerOptions.gzip = gzip;
  writerOptions.history_length = h;
  writeSamples(path, all, writerOptions);

  const std::string bytes = readBytes(path);
  ASSERT_GE(bytes.size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>(bytes[0]) == 0x1f && static_cast<unsigned char>(bytes[1]) == 0x8b, gzip);
  // The same samples give the same bytes (gzip: no name, mtime 0).
  writeSamples(dir.file("again"), all, writerOptions);
  EXPECT_EQ(readBytes(dir.file("again")), bytes);
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid()) + ".0"));

  CriteoDataset data(path, options());
  EXPECT_EQ(data.indexInfo().gzip, gzip);
  ASSERT_EQ(data.recordCount(), static_cast<int64_t>(all.size()));
  ASSERT_EQ(data.historyLength(), h);
  const CriteoExamples ex = data.readRecords(0, data.recordCount());
  for (size_t i = 0; i < all.size(); ++i) {
    const Sample& s = all[i];
    ASSERT_EQ(ex.labels[i], s.label) << i;
    for (int64_t t = 0; t < kCriteoSparseFeatures; ++t)
      ASSERT_EQ(ex.sparse[i * kCriteoSparseFeatures + t], s.sparse[t]) << i;
    for (int64_t k = 0; k < kCriteoDenseFeatures; ++k) {
      ASSERT_EQ(bitsOf(ex.dense[i * kCriteoDenseFeatures + k]), bitsOf(logCount(s.counts[k]))) << i;
    }
    ASSERT_EQ(ex.history_lengths[i], s.history_length) << i;
    for (int64_t k = 0; k < h; ++k) ASSERT_EQ(ex.history[i * h + k], s.history[k]) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(CriteoDataset, CriteoDatasetRoundTrip, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "gzip" : "plain"; });

TEST(CriteoDatasetWriter, RefusesRecordsOutOfRangeAndLeavesNoFile) {
  TempDir dir;
  const std::string path = dir.file("bad.tsv");
  {
    CriteoWriterOptions o;
    o.history_length = 2;
    CriteoWriter writer(path, o);
    Sample s = samples(1, 2, 3)[0];
    s.label = 0.5f;
    EXPECT_THROW(writer.writeSample(s), ptrain::ConfigError);
    s.label = 1;
    s.sparse[4] = -1;
    EXPECT_THROW(writer.writeSample(s), ptrain::ConfigError);
    s.sparse[4] = 0;
    s.history_length = 3;
    EXPECT_THROW(writer.writeSample(s), ptrain::ConfigError);
    s.history_length = 1;
    writer.writeSample(s);
    EXPECT_EQ(writer.recordsWritten(), 1);
  }  // never committed
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// ---- random access ----

TEST(CriteoDatasetGzip, RunsInTheMiddleEqualASequentialReadAndInflateLittle) {
  TempDir dir;
  const std::string path = dir.file("day_1.gz");
  CriteoWriterOptions writerOptions;
  writerOptions.gzip = true;
  writerOptions.history_length = 4;
  writeSamples(path, samples(40000, 4, 5), writerOptions);
  const uint64_t compressed = fs::file_size(path);
  ASSERT_GT(compressed, uint64_t{3} << 20) << "the test wants a multi-MiB gzip file";

  CriteoDataset data(path, options());
  const CriteoIndexInfo& info = data.indexInfo();
  ASSERT_TRUE(info.gzip);
  EXPECT_GT(info.text_bytes, uint64_t{8} << 20);
  EXPECT_GE(info.access_points, static_cast<int64_t>(info.text_bytes >> 20) - 1);
  const CriteoExamples all = data.readRecords(0, data.recordCount());
  EXPECT_EQ(data.readStats().bytes_inflated, info.text_bytes);

  for (const auto& [first, count] :
       std::vector<std::pair<int64_t, int64_t>>{{20000, 100}, {31234, 7}, {39990, 10}, {0, 3}}) {
    SCOPED_TRACE("records [" + std::to_string(first) + ", " + std::to_string(first + count) + ")");
    data.resetReadStats();
    const CriteoExamples part = data.readRecords(first, count);
    ASSERT_EQ(part.count, count);
    expectRowsEqual(all, first, part);
    const CriteoReadStats stats = data.readStats();
    const auto [begin, end] = data.recordBytes(first, count);
    // From the nearest access point at most ~1 MiB back (plus the block the
    // span's test lands in), to the end of the run, and no further than one
    // inflate buffer past it.
    EXPECT_LE(stats.bytes_inflated, (end - begin) + (uint64_t{3} << 20) / 2 + (256u << 10));
    EXPECT_LT(stats.bytes_inflated, info.text_bytes / 4);
    EXPECT_LT(stats.data_bytes_read, compressed / 4);
    EXPECT_EQ(stats.reads, 1u);
  }

  // Several threads at once read what one thread reads.
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const int64_t first = 5000 + 7919 * t;
      const CriteoExamples part = data.readRecords(first, 500);
      bool same = true;
      for (int64_t i = 0; i < 500 * kCriteoSparseFeatures; ++i) {
        same = same && part.sparse[i] == all.sparse[first * kCriteoSparseFeatures + i];
      }
      ok[t] = same ? 1 : 0;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

TEST(CriteoDatasetGzip, ConcatenatedMembersReadAsOneText) {
  TempDir dir;
  const std::vector<Sample> all = samples(6000, 0, 9);
  writeSamples(dir.file("a.gz"), {all.begin(), all.begin() + 3000}, {true, 6, 0});
  writeSamples(dir.file("b.gz"), {all.begin() + 3000, all.end()}, {true, 6, 0});
  const std::string path = dir.file("ab.gz");
  writeBytes(path, readBytes(dir.file("a.gz")) + readBytes(dir.file("b.gz")));
  CriteoOptions o = options();
  o.access_point_span = 64 << 10;
  CriteoDataset data(path, o);
  ASSERT_EQ(data.recordCount(), 6000);
  EXPECT_GT(data.indexInfo().access_points, 10);
  const CriteoExamples whole = data.readRecords(0, 6000);
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(whole.sparse[i * kCriteoSparseFeatures + 5], all[i].sparse[5]) << i;
  }
  for (const auto& [a, n] : std::vector<std::pair<int64_t, int64_t>>{{2990, 20}, {4500, 10}, {5999, 1}}) {
    expectRowsEqual(whole, a, data.readRecords(a, n));
  }
}

TEST(CriteoDatasetPlain, ReadingRecordsTouchesOnlyTheirBytes) {
  TempDir dir;
  const std::string path = dir.file("day_2");
  writeSamples(path, samples(5000, 3, 11), {false, 6, 3});
  const std::vector<uint64_t> starts = lineStarts(readBytes(path));
  ASSERT_EQ(starts.size(), 5001u);

  std::mutex mutex;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  CriteoOptions o = options();
  o.observer = [&](uint64_t offset, uint64_t length) {
    std::lock_guard<std::mutex> lock(mutex);
    ranges.emplace_back(offset, length);
  };
  CriteoDataset data(path, o);
  EXPECT_EQ(data.indexInfo().origin, CriteoIndexOrigin::kBuilt);
  EXPECT_TRUE(ranges.empty()) << "building the index is not a read";
  const CriteoExamples all = data.readRecords(0, 5000);
  for (const auto& [a, b] :
       std::vector<std::pair<int64_t, int64_t>>{{1000, 1250}, {4999, 5000}, {0, 1}, {2500, 2500}}) {
    SCOPED_TRACE("records [" + std::to_string(a) + ", " + std::to_string(b) + ")");
    ranges.clear();
    data.resetReadStats();
    const CriteoExamples part = data.readRecords(a, b - a);
    expectRowsEqual(all, a, part);
    EXPECT_EQ(data.recordBytes(a, b - a), std::make_pair(starts[a], starts[b]));
    if (a == b) {
      EXPECT_TRUE(ranges.empty());
      continue;
    }
    ASSERT_EQ(ranges.size(), 1u) << "one pread per run";
    EXPECT_EQ(ranges[0], std::make_pair(starts[a], starts[b] - starts[a]));
    EXPECT_EQ(data.readStats().data_bytes_read, starts[b] - starts[a]);
    EXPECT_EQ(data.readStats().bytes_inflated, 0u);
  }
}

// ---- the index ----

TEST(CriteoDatasetIndex, ReusedWhenPresentRebuiltWhenTheDataChanged) {
  TempDir dir;
  const std::string path = dir.file("day_3.gz");
  writeSamples(path, samples(2000, 0, 21), {true, 6, 0});
  const std::string indexPath = path + kCriteoIndexSuffix;
  {
    CriteoDataset data(path, options());
    EXPECT_EQ(data.indexInfo().origin, CriteoIndexOrigin::kBuilt);
    EXPECT_EQ(data.indexInfo().store, CriteoIndexStore::kFile);
    EXPECT_EQ(data.indexInfo().path, indexPath);
    EXPECT_TRUE(data.indexInfo().rebuilt_because.empty());
  }
  ASSERT_TRUE(fs::exists(indexPath));
  const std::string built = readBytes(indexPath);
  EXPECT_EQ(built.substr(0, 8), "PTRCRIDX");
  {
    CriteoDataset data(path, options());
    EXPECT_EQ(data.indexInfo().origin, CriteoIndexOrigin::kLoaded);
    EXPECT_EQ(data.recordCount(), 2000);
    expectRowsEqual(data.readRecords(0, 2000), 1500, data.readRecords(1500, 20));
  }

  // New data under the same name (another size, and another mtime for good measure).
  writeSamples(path, samples(2500, 0, 22), {true, 6, 0});
  struct timespec times[2] = {{0, UTIME_OMIT}, {1234567890, 5}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  {
    CriteoDataset data(path, options());
    EXPECT_EQ(data.indexInfo().origin, CriteoIndexOrigin::kBuilt);
    EXPECT_NE(data.indexInfo().rebuilt_because.find("the data file changed"), std::string::npos)
        << data.indexInfo().rebuilt_because;
    EXPECT_EQ(data.recordCount(), 2500);
  }
  // The same size and content but another mtime: rebuilt too.
  times[1] = {1234567891, 0};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_EQ(CriteoDataset(path, options()).indexInfo().origin, CriteoIndexOrigin::kBuilt);
  EXPECT_EQ(CriteoDataset(path, options()).indexInfo().origin, CriteoIndexOrigin::kLoaded);

  // Another format version, or a damaged index: rebuilt.
  std::string old = readBytes(indexPath);
  old[8] = 99;
  writeBytes(indexPath, old);
  {
    CriteoDataset data(path, options());
    EXPECT_EQ(data.indexInfo().origin, CriteoIndexOrigin::kBuilt);
    EXPECT_NE(data.indexInfo().rebuilt_because.find("version 99"), std::string::npos)
        << data.indexInfo().rebuilt_because;
  }
  std::string damaged = readBytes(indexPath);
  damaged[kIndexHeaderBytes] ^= 1;  // the first access point, under the CRC
  writeBytes(indexPath, damaged);
  EXPECT_EQ(CriteoDataset(path, options()).indexInfo().origin, CriteoIndexOrigin::kBuilt);
  writeBytes(indexPath, readBytes(indexPath).substr(0, 200));
  EXPECT_EQ(CriteoDataset(path, options()).indexInfo().origin, CriteoIndexOrigin::kBuilt);
  EXPECT_EQ(CriteoDataset(path, options()).indexInfo().origin, CriteoIndexOrigin::kLoaded);

  // Someone else's file under the index's name is refused, not overwritten.
  writeBytes(indexPath, "not an index at all");
  try {
    CriteoDataset data(path, options());
    FAIL() << "a foreign index file was accepted";
  } catch (const ptrain::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(indexPath + ": not a ptrain index", 0), 0u) << e.what();
  }
  EXPECT_EQ(readBytes(indexPath), "not an index at all");
  // Kept elsewhere, the index leaves that file alone.
  CriteoOptions elsewhere = options();
  elsewhere.index_dir = dir.file("indexes");
  EXPECT_EQ(CriteoDataset(path, elsewhere).recordCount(), 2500);
  EXPECT_EQ(readBytes(indexPath), "not an index at all");
}

TEST(CriteoDatasetIndex, KeptInTheGivenFolderOrInMemory) {
  TempDir dir;
  const std::string path = dir.file("day_4");
  writeSamples(path, samples(300, 2, 31), {false, 6, 2});
  const std::string cache = dir.file("cache/indexes");
  CriteoOptions o = options();
  o.index_dir = cache;
  std::string indexPath;
  {
    CriteoDataset data(path, o);
    EXPECT_EQ(data.indexInfo().store, CriteoIndexStore::kFile);
    indexPath = data.indexInfo().path;
    EXPECT_EQ(fs::path(indexPath).parent_path(), fs::path(cache));
    EXPECT_EQ(fs::path(indexPath).filename().string().rfind("day_4.", 0), 0u) << indexPath;
  }
  EXPECT_FALSE(fs::exists(path + kCriteoIndexSuffix));
  {
    CriteoDataset data(path, o);
    EXPECT_EQ(data.indexInfo().origin, CriteoIndexOrigin::kLoaded);
    EXPECT_EQ(data.indexInfo().path, indexPath);
  }

  CriteoOptions memory = options();
  memory.write_index = false;
  CriteoDataset data(path, memory);
  EXPECT_EQ(data.indexInfo().store, CriteoIndexStore::kMemory);
  EXPECT_TRUE(data.indexInfo().path.empty());
  EXPECT_FALSE(fs::exists(path + kCriteoIndexSuffix));
  CriteoDataset fromFile(path, o);
  expectRowsEqual(fromFile.readRecords(0, 300), 0, data.readRecords(0, 300));
  EXPECT_EQ(data.readStats().index_bytes_read, 0u);
  EXPECT_GT(fromFile.readStats().index_bytes_read, 0u);
}

TEST(CriteoDatasetIndex, AReadOnlyFolderKeepsTheIndexInMemory) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only folders";
  TempDir dir;
  const std::string path = dir.file("day_5.gz");
  writeSamples(path, samples(300, 0, 41), {true, 6, 0});
  fs::permissions(dir.path(), fs::perms::owner_read | fs::perms::owner_exec, fs::perm_options::replace);
  CriteoDataset data(path, options());
  EXPECT_EQ(data.indexInfo().store, CriteoIndexStore::kMemory);
  EXPECT_NE(data.indexInfo().memory_because.find("cannot create"), std::string::npos)
      << data.indexInfo().memory_because;
  EXPECT_EQ(data.readRecords(100, 50).count, 50);
}

// ---- refusals ----

TEST(CriteoDatasetOptions, BadOptionsAndRangesAreConfigErrors) {
  TempDir dir;
  const std::string path = dir.file("ok.tsv");
  writeBytes(path, line() + line());
  CriteoOptions o = options();
  o.table_sizes.pop_back();
  EXPECT_THROW(CriteoDataset(path, o), ptrain::ConfigError);
  o = options();
  o.table_sizes[3] = 0;
  EXPECT_THROW(CriteoDataset(path, o), ptrain::ConfigError);
  o = options();
  o.item_feature = 26;
  EXPECT_THROW(CriteoDataset(path, o), ptrain::ConfigError);
  EXPECT_THROW(CriteoDataset(dir.file("missing.tsv"), options()), ptrain::ConfigError);
  CriteoDataset data(path, options());
  EXPECT_THROW(data.readRecords(1, 2), ptrain::ConfigError);
  EXPECT_THROW(data.readRecords(-1, 1), ptrain::ConfigError);
  EXPECT_EQ(data.readRecords(2, 0).count, 0);

  // An empty file has no records.
  writeBytes(dir.file("empty.tsv"), "");
  EXPECT_EQ(CriteoDataset(dir.file("empty.tsv"), options()).recordCount(), 0);
  // A last line without its newline is a record.
  std::string unterminated = line() + line({{0, "1"}});
  unterminated.pop_back();
  writeBytes(dir.file("open.tsv"), unterminated);
  CriteoDataset open(dir.file("open.tsv"), options());
  ASSERT_EQ(open.recordCount(), 2);
  EXPECT_EQ(open.readRecords(1, 1).labels[0], 1.0f);
}

namespace {

struct Malformed {
  const char* name;
  std::string text;
  int line;           // the line the message names
  const char* words;  // what the message says
  bool gzip = false;
};

void PrintTo(const Malformed& c, std::ostream* os) { *os << c.name; }

std::string lines(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += line();
  return out;
}

std::string withoutLastColumn(std::string text) {
  text.erase(text.rfind('\t'));
  return text + "\n";
}

}  // namespace

class CriteoDatasetMalformed : public ::testing::TestWithParam<Malformed> {};

TEST_P(CriteoDatasetMalformed, RefusedWithFileAndLine) {
  const Malformed& c = GetParam();
  TempDir dir;
  const std::string path = dir.file("bad");
  writeBytes(path, c.gzip ? gzipped(c.text) : c.text);
  try {
    CriteoDataset data(path, options());
    data.readRecords(0, data.recordCount());
    FAIL() << "accepted";
  } catch (const ptrain::ConfigError& e) {
    const std::string message = e.what();
    const std::string where = path + ":" + std::to_string(c.line) + ": ";
    EXPECT_EQ(message.rfind(where, 0), 0u) << message;
    EXPECT_NE(message.find(c.words), std::string::npos) << message;
    EXPECT_NE(message.find("; "), std::string::npos) << "no advice: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "more than one line: " << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    CriteoDataset, CriteoDatasetMalformed,
    ::testing::Values(
        Malformed{"ShortLine", lines(1) + withoutLastColumn(line()) + lines(1), 2, "39 columns where line 1 has 40"},
        Malformed{"LongLine", lines(2) + line({}, {"1"}), 3, "41 columns where line 1 has 40"},
        Malformed{"TestFileWithoutLabels", withoutLastColumn(line()), 1, "test.txt"},
        Malformed{"SpacesNotTabs", "0 1 2 3\n", 1, "1 column"},
        Malformed{"EmptyLine", lines(2) + "\n" + lines(1), 3, "an empty line"},
        Malformed{"LabelTwo", lines(2) + line({{0, "2"}}), 3, "column 1 (the label) is \"2\", not a label"},
        Malformed{"LabelMissing", line({{0, ""}}), 1, "not a label"},
        Malformed{"IntegerWithLetters", lines(3) + line({{2, "12a"}}), 4,
                  "column 3 (integer feature I2) is \"12a\", not an integer"},
        Malformed{"IntegerJustMinus", line({{13, "-"}}), 1, "integer feature I13"},
        Malformed{"IntegerPast64Bits", lines(1) + line({{5, "99999999999999999999"}}), 2, "past 64 bits"},
        Malformed{"CategoricalNotHex", lines(1) + line({{20, "zz"}}), 2,
                  "column 21 (categorical feature C7) is \"zz\", not hex"},
        Malformed{"CategoricalPast64Bits", line({{39, "1ffffffffffffffff"}}), 1,
                  "C26) is \"1ffffffffffffffff\", past 64 bits"},
        Malformed{"ControlCharacterShownEscaped", line({{14, std::string("ab\x01")}}), 1, "\"ab\\x01\", not hex"},
        Malformed{"HistoryItemAfterEmptySlot", line({}, {"1", "", "3"}), 1, "column 43 (history slot 3)"},
        Malformed{"HistoryNotHex", line({}, {"1", "x"}), 1, "history slot 2"},
        Malformed{"GzipLabel", lines(1000) + line({{0, "7"}}) + lines(10), 1001, "not a label", true},
        Malformed{"GzipShortLine", lines(500) + withoutLastColumn(line()), 501, "39 columns where line 1 has 40",
                  true}),
    [](const ::testing::TestParamInfo<Malformed>& info) { return std::string(info.param.name); });

TEST(CriteoDatasetMalformedGzip, DamagedOrTruncatedDataNamesTheByte) {
  TempDir dir;
  const std::string text = lines(2000);
  const std::string gz = gzipped(text);
  const std::string truncated = dir.file("truncated.gz");
  writeBytes(truncated, gz.substr(0, gz.size() / 2));
  try {
    CriteoDataset data(truncated, options());
    FAIL() << "a truncated gzip file was accepted";
  } catch (const ptrain::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(truncated + ": byte ", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("gzip -t"), std::string::npos) << e.what();
  }
  const std::string trailing = dir.file("trailing.gz");
  writeBytes(trailing, gz + "garbage");
  try {
    CriteoDataset data(trailing, options());
    FAIL() << "data after the gzip stream was accepted";
  } catch (const ptrain::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(trailing + ": byte " + std::to_string(gz.size()) + ": ", 0), 0u) << e.what();
  }
}

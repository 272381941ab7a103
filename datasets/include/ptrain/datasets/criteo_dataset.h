// Criteo's click logs read and written in their own TSV text, plain or
// gzip-compressed, with random access to any run of records, so that each
// rank reads only its share of a file.
//
// The format (Criteo's Kaggle Display Advertising Challenge train.txt and the
// Terabyte Click Logs' day_N files), one record per line, tab-separated:
//   column 0          the label, "0" or "1"
//   columns 1-13      the 13 integer features, decimal, possibly negative, or
//                     empty (missing)
//   columns 14-39     the 26 categorical features, hex strings (8 digits in
//                     Criteo's data, any case, at most 64 bits), or empty
//   columns 40-40+H   ptrain's extension, optional: the sample's item history,
//                     H hex item ids, the valid ones first, then empty slots
// Every line of a file has the same number of columns: 40 (no history) or
// 40 + H with 1 <= H <= kCriteoMaxHistory. Lines end with "\n" (a "\r" before
// it is ignored); the last line may lack it. Criteo's test.txt (39 columns,
// no label) is refused.
//
// What a record becomes (CriteoExamples: ClicksExamples' fields and row-major
// layout from clicks.h, less the probabilities real logs do not have):
//   dense     criteoLogCount(count) = float(log1p(double(max(count, 0)))), a
//             missing count being 0. As DLRM's data_utils.py does (missing to
//             0, X_int[X_int < 0] = 0, then log(x + 1)), and exactly what
//             ClicksDataset carries. TorchRec's BinaryCriteoUtils.tsv_to_npys
//             also maps a missing count to 0 but takes log(x + 3) without
//             clamping; ptrain follows DLRM so that a model trained on the
//             synthetic clicks sees the same transform.
//   sparse    the hex value v as an unsigned 64-bit integer, then
//             v % table_sizes[t]: TorchRec's hashing of Criteo's ids
//             (InMemoryBinaryCriteoIterDataPipe's `hashes`; DLRM's
//             --max-ind-range). A missing categorical is v = 0, as TorchRec's
//             int(value or "0", 16), so it lands on row 0
//             (kCriteoMissingCategoryRow) of its table.
//   history   the valid slots' items, each v % table_sizes[item_feature],
//             then -1; history_lengths counts the valid slots. A 40-column
//             file gives length 0 and all -1.
//   labels    0 or 1 as float.
// Fields are checked when their record is read (readRecords); the column
// count of every line is checked when the index is built. Each problem is a
// ConfigError of one line "FILE:LINE: what was expected; how to fix" (LINE
// 1-based, of the uncompressed text), or "FILE: byte N: ..." for damaged
// gzip data.
//
// The index. Reading records [a, b) needs where they start. One sequential
// scan of the file (at construction, the first time) finds every line start
// and keeps it: (record count + 1) u64 offsets into the text, 8 bytes a line
// (about 370 MB for Kaggle's 45.8M lines, 1.6 GB for a Terabyte day of 195M),
// on disk; in memory only while the index is built, or where it cannot be
// written.
// For gzip it also keeps zlib access points as zlib's examples/zran.c does:
// every ~access_point_span bytes of uncompressed text, at a deflate block
// boundary, the compressed bit position, the uncompressed offset, the number
// of the first record starting at or after it, and the 32 KiB window before
// it, so a read decompresses only from the nearest access point before its
// first record (32 KiB per span: 3 % of the text at the default 1 MiB).
// Concatenated gzip members (cat a.gz b.gz) are read as one text. Each
// readRecords call starts again from an access point, so a rank that walks
// its share in order should read runs well above the span (say 8 MiB of text,
// ~25k records) and slice them: a run of r bytes inflates about r + span / 2.
// The scan costs one pass over the text (plain: ~1 GB/s from the page cache;
// gzip: zlib's inflate speed, ~150 MB/s of text).
//
// The index file, FILE.ptrain-index beside the data (or in options.index_dir),
// little-endian, version kCriteoIndexVersion:
//   header (80 bytes): magic "PTRCRIDX", version, compression (0 plain,
//     1 gzip), the data file's size and mtime (ns), the text's size, the
//     record count, the column count, the window size, the access point span
//     and count, and a CRC-32 of the header and the access point table;
//   access points, 32 bytes each: compressed byte offset, uncompressed
//     offset, first record, bit count (the bits of the byte before the
//     offset that the point starts with);
//   windows, 32 KiB each;
//   offsets, (record count + 1) u64: record i spans [offset[i], offset[i+1]).
// It is written atomically (a temp file renamed into place). When opened, an
// index whose data size or mtime differs from the data file's, whose version
// is another, or whose CRC or size does not add up is rebuilt (indexInfo()
// says why); a file that does not start with the magic is someone else's and
// is never overwritten: where the new index would be written, the dataset
// refuses to open (ConfigError); elsewhere the file is passed over. The
// offsets and windows are not under the CRC: each read checks that its
// records end where the next begins. An index is read lazily with pread (the
// header and access point table stay in memory; each read takes its offsets
// and at most one window from the file), so ranks sharing a node share it
// through the page cache. Where neither the data's folder
// (nor index_dir) can be written, the index stays in this process's memory.
// Several processes may build the same index at once: each renames a whole
// file into place, and the contents are equal.
//
// Thread-safety: every const method may be called from several threads at
// once (reads are pread on a shared descriptor; the counters are atomic); the
// observer is called on the reading thread. CriteoWriter is for one thread.
//
// Torch-free; linked statically into the trainers that use it (ptrain_datasets).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ptrain::datasets {

inline constexpr int64_t kCriteoLabelColumns = 1;
inline constexpr int64_t kCriteoDenseFeatures = 13;
inline constexpr int64_t kCriteoSparseFeatures = 26;
// label + 13 integers + 26 categoricals.
inline constexpr int64_t kCriteoBaseColumns = kCriteoLabelColumns + kCriteoDenseFeatures + kCriteoSparseFeatures;
// The most history columns a line may carry.
inline constexpr int64_t kCriteoMaxHistory = 1024;
// The row a missing categorical lands on (TorchRec's int("0", 16) % size).
inline constexpr int64_t kCriteoMissingCategoryRow = 0;
inline constexpr uint32_t kCriteoIndexVersion = 1;
// The index file's name beside the data: FILE + kCriteoIndexSuffix.
inline constexpr const char* kCriteoIndexSuffix = ".ptrain-index";
// Uncompressed bytes between gzip access points (zran.c's SPAN).
inline constexpr int64_t kCriteoDefaultAccessPointSpan = int64_t{1} << 20;
// The deflate window each access point keeps.
inline constexpr int64_t kCriteoWindowBytes = 32768;

// A dense count as the model sees it: log(1 + max(count, 0)) in double,
// rounded once to float, so every reader and writer computes the same bits.
inline float criteoLogCount(int64_t count) {
  return static_cast<float>(std::log1p(static_cast<double>(count < 0 ? 0 : count)));
}

// Called with each contiguous byte range [offset, offset + length) that a
// read takes from the data file (compressed bytes for gzip).
using CriteoByteRangeObserver = std::function<void(uint64_t offset, uint64_t length)>;

struct CriteoOptions {
  // 26 table sizes, each in [1, 2^62]; categorical t lands in [0, table_sizes[t]).
  std::vector<int64_t> table_sizes;
  // The categorical feature whose table the history items hash into, in [0, 26).
  int64_t item_feature = 1;
  // H, the history slots of each example; -1 takes the file's (0 for a
  // 40-column file). A file with history columns must have exactly H; a file
  // without gives every example length 0.
  int64_t history_length = -1;
  // Where to write a new index: "" beside the data (FILE.ptrain-index), else
  // this folder (created if missing; the file named after the data file and a
  // hash of its absolute path). A valid index beside the data is used first
  // either way. Where the folder cannot be written, the index stays in memory.
  std::string index_dir;
  // false: never write an index file (one already there is still used).
  bool write_index = true;
  // gzip: uncompressed bytes between access points, in [64 KiB, 1 GiB]; only
  // used when the index is built.
  int64_t access_point_span = kCriteoDefaultAccessPointSpan;
  // Optional; see CriteoByteRangeObserver. Must be thread-safe if records are
  // read from several threads.
  CriteoByteRangeObserver observer;
};

// Records first..first+count-1 of a file, row-major, as ClicksExamples lays
// them out (without its probabilities, which real logs do not have).
struct CriteoExamples {
  int64_t count = 0;
  int64_t history_length = 0;            // H
  std::vector<int64_t> sparse;           // count x 26, hashed into the tables
  std::vector<float> dense;              // count x 13, criteoLogCount
  std::vector<int64_t> history;          // count x H, -1 past history_lengths
  std::vector<int64_t> history_lengths;  // count, in [0, H]
  std::vector<float> labels;             // count, 0 or 1
};

// What the reads of one CriteoDataset have cost since construction (or
// resetReadStats()); the index's build and load are not counted.
struct CriteoReadStats {
  uint64_t reads = 0;             // readRecords calls
  uint64_t data_bytes_read = 0;   // bytes read from the data file (compressed for gzip)
  uint64_t bytes_inflated = 0;    // gzip: text decompressed, the skipped bytes before a run included
  uint64_t index_bytes_read = 0;  // bytes of offsets and windows read from the index file
};

enum class CriteoIndexOrigin { kLoaded, kBuilt };
enum class CriteoIndexStore { kFile, kMemory };

struct CriteoIndexInfo {
  CriteoIndexOrigin origin = CriteoIndexOrigin::kBuilt;
  CriteoIndexStore store = CriteoIndexStore::kMemory;
  std::string path;             // the index file in use; "" in memory
  std::string rebuilt_because;  // why an index found on disk was not used, or ""
  std::string memory_because;   // why a built index could not be written, or ""
  bool gzip = false;
  int64_t columns = 0;
  uint64_t text_bytes = 0;    // the (uncompressed) text's size
  int64_t access_points = 0;  // gzip only
  int64_t access_point_span = 0;
};

class CriteoDataset {
 public:
  // Opens `path` (gzip when it starts with gzip's magic bytes 1f 8b, plain
  // text otherwise; the name does not matter), checks the options, and loads
  // its index or builds it with one sequential scan (then writes it as the
  // header describes). Throws ConfigError for bad options, a file that cannot
  // be read, a line with another column count ("FILE:LINE: ..."), damaged
  // gzip data, a file changed while it was scanned, or a file that is not a
  // ptrain index where the new index would be written.
  CriteoDataset(std::string path, CriteoOptions options);
  ~CriteoDataset();
  CriteoDataset(const CriteoDataset&) = delete;
  CriteoDataset& operator=(const CriteoDataset&) = delete;

  const std::string& path() const { return path_; }
  const CriteoOptions& options() const { return options_; }
  // The records (lines) of the file, from the index.
  int64_t recordCount() const;
  // H of the examples readRecords returns.
  int64_t historyLength() const { return historyLength_; }
  // The history columns of the file's lines (columns - 40; 0 for an empty file).
  int64_t fileHistoryColumns() const;
  // Where the index came from and where it lives; fixed after construction.
  const CriteoIndexInfo& indexInfo() const;

  // Records first..first+count-1 (first, count >= 0, first + count <=
  // recordCount()), parsed and hashed. A plain file is read with one pread of
  // exactly those records' bytes; a gzip file is decompressed from the last
  // access point at or before the first record up to the end of the last.
  // Throws ConfigError "FILE:LINE: ..." for a malformed field, ConfigError
  // for a range past the end, and ConfigError when the data no longer matches
  // its index (the file changed after it was opened).
  CriteoExamples readRecords(int64_t first, int64_t count) const;
  // The text bytes [begin, end) of records first..first+count-1 (offsets in
  // the uncompressed text for gzip), from the index.
  std::pair<uint64_t, uint64_t> recordBytes(int64_t first, int64_t count) const;

  // The counters so far (each read atomically; a read running meanwhile may
  // show in some and not yet in others).
  CriteoReadStats readStats() const;
  // Sets every counter to 0.
  void resetReadStats();

  struct Index;  // the offsets and access points (criteo_dataset.cpp)

 private:
  std::string readText(uint64_t begin, uint64_t end) const;
  std::string readGzipText(uint64_t begin, uint64_t end) const;
  void preadData(void* out, uint64_t offset, uint64_t length) const;

  std::string path_;
  CriteoOptions options_;
  int fd_ = -1;
  int64_t historyLength_ = 0;
  std::unique_ptr<Index> index_;
  mutable std::atomic<uint64_t> reads_{0};
  mutable std::atomic<uint64_t> dataBytesRead_{0};
  mutable std::atomic<uint64_t> bytesInflated_{0};
  mutable std::atomic<uint64_t> indexBytesRead_{0};
};

struct CriteoWriterOptions {
  bool gzip = false;           // gzip-compress (no file name, mtime 0: the same bytes for the same records and zlib)
  int gzip_level = 6;          // zlib's level, in [1, 9]
  int64_t history_length = 0;  // H history columns after the 40 (0: none), in [0, kCriteoMaxHistory]
};

// Writes records as Criteo TSV lines: the label, the 13 counts in decimal,
// the 26 ids as lowercase hex of at least 8 digits ("%08x"), then H history
// columns (the valid items in the same hex, then empty). Ids below their
// table size read back unchanged, and the counts' criteoLogCount gives the
// same bits, so writing samples and reading them back is exact (for counts
// >= 0; a negative count reads back as 0, as Criteo's do).
//
// The file appears at `path` only on commit(), renamed from a temp file in
// the same folder; a writer destroyed without commit() removes its temp file.
// For one thread. Throws ConfigError when the file cannot be written or a
// record is out of range (label not 0/1, a negative id or history item, a
// history length outside [0, H]).
class CriteoWriter {
 public:
  CriteoWriter(std::string path, CriteoWriterOptions options = {});
  ~CriteoWriter();
  CriteoWriter(const CriteoWriter&) = delete;
  CriteoWriter& operator=(const CriteoWriter&) = delete;

  // One record: label 0 or 1; counts[13]; ids[26] >= 0; history[history_length]
  // item ids >= 0 (may be null when history_length is 0), history_length in
  // [0, H]. The history is dropped when H is 0.
  void write(float label, const int64_t* counts, const int64_t* ids, const int64_t* history, int64_t historyLength);
  // Any sample with ClicksSample's fields (label, counts, sparse, history,
  // history_length), e.g. ClicksSample itself.
  template <typename Sample>
  void writeSample(const Sample& sample) {
    write(sample.label, sample.counts.data(), sample.sparse.data(), sample.history.data(), sample.history_length);
  }
  // Flushes, fsyncs and renames the file into place; after it, write() throws.
  void commit();
  int64_t recordsWritten() const { return records_; }

  struct Sink;  // the temp file and its compressor (criteo_writer.cpp)

 private:
  std::string path_;
  CriteoWriterOptions options_;
  std::unique_ptr<Sink> sink_;
  std::string line_;
  int64_t records_ = 0;
};

}  // namespace ptrain::datasets

#include "click_files.h"

#include "ptrain/datasets/clicks_batch.h"

#include <torch/torch.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>

#include "ptrain/core/error.h"
#include "ptrain/datasets/splitmix.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ptrain::recommender {

namespace {

// Tags that keep the block order's and the in-block orders' streams apart.
constexpr uint64_t kBlockOrderTag = 0x626C6F636BULL;  // "block"
constexpr uint64_t kInBlockTag = 0x696E626CULL;       // "inbl"

json fileStamp(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return json{{"path", path}};
  const int64_t mtimeNs = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return json{{"path", path}, {"bytes", static_cast<int64_t>(st.st_size)}, {"mtime_ns", mtimeNs}};
}

void shuffleInPlace(std::vector<int64_t>& v, uint64_t seed) {
  datasets::SplitMix64 rng(seed);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

std::unique_ptr<datasets::CriteoDataset> open(const std::string& path, const ClickFilesOptions& o) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw ConfigError(path + ": no such file; export one with `ptrain data export clicks OUT.tsv.gz --recipe R`, or "
                             "give Criteo's train.txt (plain or gzip)");
  }
  datasets::CriteoOptions c;
  c.table_sizes = o.table_sizes;
  c.item_feature = o.item_feature;
  c.history_length = -1;  // checked below, with the recipe's key in the message
  auto file = std::make_unique<datasets::CriteoDataset>(path, c);
  const int64_t columns = file->fileHistoryColumns();
  if (columns > 0 && columns != o.history_length) {
    throw ConfigError(path + ": its lines carry " + std::to_string(columns) + " history columns but "
                      "data.history_length is " + std::to_string(o.history_length) + "; set data.history_length: " +
                      std::to_string(columns) + " (or re-export the file with the recipe's)");
  }
  return file;
}

}  // namespace

std::string validationPathFor(const std::string& trainPath) {
  const fs::path p(trainPath);
  std::string name = p.filename().string();
  const size_t at = name.rfind("train");
  if (at != std::string::npos) {
    name.replace(at, 5, "validation");
  } else {
    std::string ext;
    for (const char* e : {".tsv.gz", ".tsv", ".gz"}) {
      const std::string s(e);
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
        ext = s;
        break;
      }
    }
    name = name.substr(0, name.size() - ext.size()) + ".validation" + ext;
  }
  return (p.parent_path() / name).string();
}

ClickFiles::ClickFiles(ClickFilesOptions options) : options_(std::move(options)) {
  PTRAIN_CHECK(options_.shuffle_block >= 1, "click files: shuffle_block ", options_.shuffle_block);
  train_ = open(options_.train_path, options_);
  if (train_->recordCount() == 0) {
    throw ConfigError(options_.train_path + ": holds no records; the training file needs at least one line");
  }
  if (!options_.validation_path.empty()) {
    validation_ = open(options_.validation_path, options_);
    if (validation_->recordCount() == 0) {
      throw ConfigError(options_.validation_path + ": holds no records; give a validation file with lines, or set "
                                                   "data.eval_size: 0");
    }
  }
}

ClickFiles::~ClickFiles() = default;

int64_t ClickFiles::trainRecords() const { return train_->recordCount(); }
int64_t ClickFiles::validationRecords() const { return validation_ ? validation_->recordCount() : 0; }

std::shared_ptr<const std::vector<int64_t>> ClickFiles::blockOrder(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cachedOrder_ && cachedEpoch_ == epoch) return cachedOrder_;
  const int64_t n = trainRecords(), b = options_.shuffle_block;
  auto order = std::make_shared<std::vector<int64_t>>(static_cast<size_t>((n + b - 1) / b));
  for (size_t i = 0; i < order->size(); ++i) (*order)[i] = static_cast<int64_t>(i);
  shuffleInPlace(*order, datasets::combine(datasets::combine(options_.seed, kBlockOrderTag), epoch));
  cachedEpoch_ = epoch;
  cachedOrder_ = order;
  return order;
}

int64_t ClickFiles::recordOf(int64_t sample) const {
  PTRAIN_CHECK(sample >= 0, "click files: sample ", sample);
  return recordsOf(sample, 1).front();
}

Batch ClickFiles::trainRows(int64_t first, int64_t count) const {
  PTRAIN_CHECK(first >= 0 && count >= 0, "click files: samples ", first, "+", count);
  return read(*train_, recordsOf(first, count));
}

std::vector<int64_t> ClickFiles::recordsOf(int64_t first, int64_t count) const {
  std::vector<int64_t> records(static_cast<size_t>(count));
  if (!options_.shuffle) {
    for (int64_t r = 0; r < count; ++r) records[static_cast<size_t>(r)] = (first + r) % trainRecords();
  } else {
    // Each (epoch, block) order is drawn once for the rows here.
    const int64_t n = trainRecords(), b = options_.shuffle_block;
    const int64_t blocks = (n + b - 1) / b, last = n - (blocks - 1) * b;
    std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> within;
    for (int64_t r = 0; r < count; ++r) {
      const int64_t sample = first + r, epoch = sample / n, pos = sample % n;
      const auto order = blockOrder(epoch);
      const int64_t shortAt = std::find(order->begin(), order->end(), blocks - 1) - order->begin();
      int64_t j = 0, k = 0;
      if (pos < shortAt * b) {
        j = pos / b, k = pos % b;
      } else if (pos < shortAt * b + last) {
        j = shortAt, k = pos - shortAt * b;
      } else {
        const int64_t q = pos - shortAt * b - last;
        j = shortAt + 1 + q / b, k = q % b;
      }
      const int64_t block = (*order)[static_cast<size_t>(j)];
      auto& perm = within[{epoch, block}];
      if (perm.empty()) {
        const int64_t size = block == blocks - 1 ? last : b;
        perm.resize(static_cast<size_t>(size));
        for (int64_t i = 0; i < size; ++i) perm[static_cast<size_t>(i)] = i;
        shuffleInPlace(perm, datasets::combine(datasets::combine(datasets::combine(options_.seed, kInBlockTag), epoch),
                                               block));
      }
      records[static_cast<size_t>(r)] = block * b + perm[static_cast<size_t>(k)];
    }
  }
  return records;
}

Batch ClickFiles::validationRows(int64_t first, int64_t count) const {
  PTRAIN_CHECK(validation_ != nullptr, "click files: no validation file");
  std::vector<int64_t> records(static_cast<size_t>(count));
  for (int64_t r = 0; r < count; ++r) records[static_cast<size_t>(r)] = (first + r) % validation_->recordCount();
  return read(*validation_, records);
}

Batch ClickFiles::read(const datasets::CriteoDataset& file, const std::vector<int64_t>& records) const {
  const int64_t count = static_cast<int64_t>(records.size());
  const int64_t hl = options_.history_length;
  at::Tensor sparse = torch::empty({count, datasets::kCriteoSparseFeatures}, torch::kInt64);
  at::Tensor dense = torch::empty({count, datasets::kCriteoDenseFeatures}, torch::kFloat32);
  at::Tensor history = torch::full({count, hl}, -1, torch::kInt64);
  at::Tensor lengths = torch::zeros({count}, torch::kInt64);
  at::Tensor labels = torch::empty({count}, torch::kFloat32);
  int64_t* sp = sparse.data_ptr<int64_t>();
  float* de = dense.data_ptr<float>();
  int64_t* hi = history.data_ptr<int64_t>();
  int64_t* le = lengths.data_ptr<int64_t>();
  float* la = labels.data_ptr<float>();

  // (record, row), by record: each run of consecutive records is one read.
  std::vector<std::pair<int64_t, int64_t>> wanted(records.size());
  for (int64_t r = 0; r < count; ++r) wanted[static_cast<size_t>(r)] = {records[static_cast<size_t>(r)], r};
  std::sort(wanted.begin(), wanted.end());
  const bool gzip = file.indexInfo().gzip;
  const uint64_t span = static_cast<uint64_t>(std::max<int64_t>(0, file.indexInfo().access_point_span));
  size_t i = 0;
  while (i < wanted.size()) {
    size_t j = i + 1;
    int64_t end = wanted[i].first + 1;  // one past the run's last record
    while (j < wanted.size()) {
      const int64_t next = wanted[j].first;
      bool joins = next < end + 1;  // the same record again, or the next one
      if (!joins && gzip) {
        // Inflating the gap costs less than starting again from an access point.
        joins = file.recordBytes(next, 1).first - file.recordBytes(end - 1, 1).second < span;
      }
      if (!joins) break;
      end = std::max(end, next + 1);
      ++j;
    }
    const int64_t runFirst = wanted[i].first;
    const datasets::CriteoExamples ex = file.readRecords(runFirst, end - runFirst);
    for (size_t w = i; w < j; ++w) {
      const int64_t k = wanted[w].first - runFirst, row = wanted[w].second;
      std::copy_n(ex.sparse.data() + k * datasets::kCriteoSparseFeatures, datasets::kCriteoSparseFeatures,
                  sp + row * datasets::kCriteoSparseFeatures);
      std::copy_n(ex.dense.data() + k * datasets::kCriteoDenseFeatures, datasets::kCriteoDenseFeatures,
                  de + row * datasets::kCriteoDenseFeatures);
      // A file without history columns gives H = 0: every slot stays -1.
      if (ex.history_length == hl && hl > 0) std::copy_n(ex.history.data() + k * hl, hl, hi + row * hl);
      le[row] = ex.history_length == hl ? ex.history_lengths[static_cast<size_t>(k)] : 0;
      la[row] = ex.labels[static_cast<size_t>(k)];
    }
    i = j;
  }
  // The generator's own layout (clicks_batch.h), so equal samples give equal batches.
  return datasets::clicksBatchOf(sparse, dense, history, lengths, labels, options_.category_feature,
                                 options_.interest_feature);
}

json ClickFiles::position(int64_t consumed) const {
  json files = json::array();
  files.push_back(fileStamp(options_.train_path));
  if (!options_.validation_path.empty()) files.push_back(fileStamp(options_.validation_path));
  return json{{"source", "criteo"},
              {"files", files},
              {"records", trainRecords()},
              {"shuffle", options_.shuffle},
              {"shuffle_block", options_.shuffle_block},
              {"seed", options_.seed},
              {"consumed_samples", consumed},
              {"epoch", consumed / trainRecords()}};
}

std::optional<std::string> ClickFiles::differs(const json& saved) const {
  if (!saved.is_object() || saved.value("source", "") != "criteo") {
    return std::string("the checkpoint's run read the built-in clicks (data.name: clicks), this one files "
                       "(data.name: criteo): resuming would not continue the same samples; start a new run with "
                       "checkpoint.load");
  }
  const json now = position(0);
  if (saved.value("files", json()) != now.at("files")) {
    return std::string("the data files changed since the checkpoint (their paths, sizes or times differ): resuming "
                       "would not continue the same sample order; restore them, or start a new run with "
                       "checkpoint.load");
  }
  for (const char* key : {"records", "shuffle", "shuffle_block", "seed"}) {
    if (saved.value(key, json()) != now.at(key)) {
      return "the sample order changed since the checkpoint: " + std::string(key) + " was " +
             saved.value(key, json()).dump() + " and is " + now.at(key).dump() +
             "; resuming would not continue where it stopped: set it back, or start a new run with checkpoint.load";
    }
  }
  return std::nullopt;
}

}  // namespace ptrain::recommender

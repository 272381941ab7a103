#include "token_corpus.h"

#include <torch/torch.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ptrain/core/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ptrain::llm {

namespace {

// A number as Megatron's --data-path weights are written ("0.3", "1").
std::optional<double> weightOf(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == nullptr || *end != '\0') return std::nullopt;
  return v;
}

json fileStamp(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return json{{"path", path}};
  const int64_t mtimeNs = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return json{{"path", path}, {"bytes", static_cast<int64_t>(st.st_size)}, {"mtime_ns", mtimeNs}};
}

}  // namespace

CorpusMetadata readCorpusMetadata(const std::string& prefix) {
  CorpusMetadata m;
  const std::string path = prefix + ".json";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return m;
  std::ifstream in(path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw ConfigError(path + ": not JSON (" + std::string(e.what()) + "); rewrite it with ptrain data prepare");
  }
  if (!j.is_object() || j.value("format", "") != "ptrain.tokens" || !j.contains("vocab_size") ||
      !j.at("vocab_size").is_number_integer() || j.at("vocab_size").get<int64_t>() < 1) {
    throw ConfigError(path + ": not a token data set's metadata (expected {\"format\": \"ptrain.tokens\", "
                             "\"vocab_size\": N, ...}); remove it, or rewrite it with ptrain data prepare");
  }
  m.vocab_size = j.at("vocab_size").get<int64_t>();
  m.eod = j.value("eod", int64_t{-1});
  return m;
}

TokenCorpus::TokenCorpus(const TokenCorpusOptions& options) : options_(options) {
  const auto& path = options.path;
  if (path.empty()) {
    throw ConfigError("data.path: not set; the megatron data set needs the prefix of its .bin/.idx files, e.g. "
                      "data.path: [data/wiki_text_document], or weights and prefixes: [0.7, a, 0.3, b]");
  }
  // Weight, prefix, weight, prefix... when every other entry is a number.
  std::vector<std::string> prefixes;
  bool weighted = path.size() % 2 == 0;
  for (size_t i = 0; weighted && i < path.size(); i += 2) weighted = weightOf(path[i]).has_value();
  for (size_t i = 0; i < path.size(); ++i) {
    if (weighted && i % 2 == 0) {
      const double w = *weightOf(path[i]);
      if (!(w > 0)) {
        throw ConfigError("data.path: weight " + path[i] + " of " + path[i + 1] + " is not positive; give each file a "
                          "weight > 0, or drop the weights to blend by size");
      }
      weights_.push_back(w);
    } else {
      prefixes.push_back(path[i]);
    }
  }
  for (const auto& prefix : prefixes) {
    std::string p = prefix;
    for (const char* ext : {".bin", ".idx"}) {
      if (p.size() > 4 && p.compare(p.size() - 4, 4, ext) == 0) p.resize(p.size() - 4);
    }
    files_.push_back(std::make_shared<const datasets::IndexedDataset>(p));
    vocab_ = std::max(vocab_, readCorpusMetadata(p).vocab_size);
  }
  datasets::GptBlendOptions blend;
  blend.split = options.split;
  blend.samples.sequence_length = options.seq_length;
  blend.samples.seed = options.seed;
  train_ = std::make_unique<datasets::BlendedGptSamples>(files_, weights_, datasets::MegatronSplit::kTrain,
                                                         options.train_samples, blend);
  if (train_->size() < options.train_samples) {
    throw ConfigError("data.path: the train split holds " + std::to_string(train_->size()) + " samples of " +
                      std::to_string(options.seq_length + 1) + " tokens, fewer than the run's " +
                      std::to_string(options.train_samples) + " (train.steps x train.global_batch_size)");
  }
  if (options.validation_samples > 0 && datasets::megatronSplitRange(options.split, datasets::MegatronSplit::kValidation,
                                                                      files_.front()->sequenceCount())) {
    validation_ = std::make_unique<datasets::BlendedGptSamples>(
        files_, weights_, datasets::MegatronSplit::kValidation, options.validation_samples, blend);
  }
}

Batch TokenCorpus::rows(const datasets::BlendedGptSamples& samples, int64_t first, int64_t count, int64_t vocab) const {
  const int64_t len = options_.seq_length;
  at::Tensor tokens = torch::zeros({count, len}, torch::kInt64);
  at::Tensor targets = torch::zeros({count, len}, torch::kInt64);
  at::Tensor mask = torch::ones({count, len}, torch::kFloat32);
  int64_t* tok = tokens.data_ptr<int64_t>();
  int64_t* tgt = targets.data_ptr<int64_t>();
  float* msk = mask.data_ptr<float>();
  for (int64_t r = 0; r < count; ++r) {
    const int64_t i = (first + r) % samples.size();
    const std::vector<int64_t> ids = samples.sample(i);
    for (int64_t t = 0; t <= len; ++t) {
      const int64_t id = ids[static_cast<size_t>(t)];
      if (id >= vocab) {
        const auto& file = samples.dataset(samples.datasetOf(i)).dataset();
        throw ConfigError(file.binPath() + ": token id " + std::to_string(id) + " (in sample " + std::to_string(i) +
                          ") is not below model.vocab_size " + std::to_string(vocab) +
                          "; set model.vocab_size to the tokenizer's vocabulary");
      }
      // megatron's padding of a partial last sample: no loss there.
      const bool pad = id < 0;
      if (t < len) tok[r * len + t] = pad ? 0 : id;
      if (t >= 1) {
        tgt[r * len + t - 1] = pad ? 0 : id;
        if (pad) msk[r * len + t - 1] = 0.0f;
      }
    }
  }
  Batch batch;
  batch.tensors.emplace("tokens", tokens);
  batch.tensors.emplace("targets", targets);
  batch.tensors.emplace("loss_mask", mask);
  return batch;
}

Batch TokenCorpus::trainRows(int64_t first, int64_t count, int64_t vocab) const {
  return rows(*train_, first, count, vocab);
}

Batch TokenCorpus::validationRows(int64_t first, int64_t count, int64_t vocab) const {
  PTRAIN_CHECK(validation_ != nullptr, "token corpus: no validation split");
  return rows(*validation_, first, count, vocab);
}

json TokenCorpus::position(int64_t consumed) const {
  json files = json::array();
  for (const auto& f : files_) {
    files.push_back(fileStamp(f->binPath()));
    files.push_back(fileStamp(f->idxPath()));
  }
  return json{{"source", "megatron"},
              {"files", files},
              {"weights", weights_},
              {"split", options_.split},
              {"seed", options_.seed},
              {"seq_length", options_.seq_length},
              {"train_samples", options_.train_samples},
              {"consumed_samples", consumed}};
}

std::optional<std::string> TokenCorpus::differs(const json& saved) const {
  if (!saved.is_object() || saved.value("source", "") != "megatron") {
    return std::string("the checkpoint's run read another data set (data.name changed)");
  }
  const json now = position(0);
  if (saved.value("files", json()) != now.at("files")) {
    return std::string("the data files changed since the checkpoint (their list, sizes or times differ): resuming "
                       "would not continue the same sample order; restore them, or start a new run with "
                       "checkpoint.load");
  }
  for (const char* key : {"weights", "split", "seed", "seq_length", "train_samples"}) {
    if (saved.value(key, json()) != now.at(key)) {
      std::string what = std::string(key) + " was " + saved.value(key, json()).dump() + " and is " + now.at(key).dump();
      if (std::string(key) == "train_samples") {
        what += " (train.steps x train.global_batch_size: the sample order is built for that many samples, as "
                "megatron's train_samples)";
      }
      return "the sample order changed since the checkpoint: " + what +
             "; resuming would not continue where it stopped: set it back, or start a new run with checkpoint.load";
    }
  }
  return std::nullopt;
}

uint64_t TokenCorpus::bytesRead() const {
  uint64_t total = 0;
  for (const auto& f : files_) total += f->bytesRead();
  return total;
}

}  // namespace ptrain::llm

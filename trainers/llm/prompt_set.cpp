#include "prompt_set.h"

#include <torch/torch.h>

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <numeric>

#include "ptrain/core/error.h"
#include "ptrain/datasets/arithmetic.h"
#include "ptrain/datasets/splitmix.h"

namespace ptrain::llm {

using datasets::ArithmeticTokenizer;

namespace {

// The first character outside the vocabulary, or 0.
char foreignCharacter(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '*' || c == '=')) return c;
  }
  return 0;
}

}  // namespace

PromptSet::PromptSet(const std::string& path) : path_(path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot be read; give a JSONL file of {\"prompt\": ..., \"answer\": ...} lines");
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw ConfigError(where + "not a JSON object; expected one a line, e.g. {\"prompt\": \"12+7=\", \"answer\": \"19\"}");
    }
    PromptAnswer item;
    for (auto [key, into] : {std::pair<const char*, std::string*>{"prompt", &item.prompt}, {"answer", &item.answer}}) {
      if (!j.is_object() || !j.contains(key) || !j.at(key).is_string() || j.at(key).get<std::string>().empty()) {
        throw ConfigError(where + "no non-empty string \"" + key + "\"; each line needs \"prompt\" and \"answer\"");
      }
      *into = j.at(key).get<std::string>();
      if (char c = foreignCharacter(*into)) {
        throw ConfigError(where + key + " holds '" + std::string(1, c) +
                          "', which the GPT's arithmetic vocabulary lacks (digits and + - * = only)");
      }
    }
    longest_ = std::max<int64_t>(longest_, static_cast<int64_t>(item.prompt.size() + item.answer.size()) + 1);
    longest_answer_ = std::max<int64_t>(longest_answer_, static_cast<int64_t>(item.answer.size()) + 1);
    items_.push_back(std::move(item));
  }
  if (items_.empty()) throw ConfigError(path + ": holds no problem; give one JSON object a line");
}

nlohmann::json PromptSet::stamp() const {
  struct stat st{};
  if (::stat(path_.c_str(), &st) != 0) return nlohmann::json{{"path", path_}};
  return nlohmann::json{{"path", path_},
                        {"bytes", static_cast<int64_t>(st.st_size)},
                        {"mtime_ns", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec}};
}

int64_t promptOrder(int64_t index, int64_t size, bool shuffle, uint64_t seed) {
  const int64_t epoch = index / size, pos = index % size;
  if (!shuffle) return pos;
  // Fisher-Yates over [0, size) from the epoch's own stream: O(size), the
  // set is in memory anyway; cached for the last epoch asked.
  thread_local std::vector<int64_t> order;
  thread_local int64_t cachedEpoch = -1, cachedSize = -1;
  thread_local uint64_t cachedSeed = 0;
  if (cachedEpoch != epoch || cachedSize != size || cachedSeed != seed) {
    order.resize(static_cast<size_t>(size));
    std::iota(order.begin(), order.end(), 0);
    datasets::SplitMix64 rng(datasets::combine(datasets::mix64(seed), static_cast<uint64_t>(epoch)));
    for (int64_t i = size - 1; i > 0; --i) {
      std::swap(order[static_cast<size_t>(i)], order[rng.below(static_cast<uint64_t>(i + 1))]);
    }
    cachedEpoch = epoch;
    cachedSize = size;
    cachedSeed = seed;
  }
  return order[static_cast<size_t>(pos)];
}

Batch promptBatch(const std::vector<PromptAnswer>& items, int64_t len) {
  const int64_t rows = static_cast<int64_t>(items.size());
  at::Tensor tokens = torch::full({rows, len}, ArithmeticTokenizer::kPad, torch::kInt64);
  at::Tensor targets = torch::full({rows, len}, ArithmeticTokenizer::kPad, torch::kInt64);
  at::Tensor mask = torch::zeros({rows, len}, torch::kFloat32);
  int64_t* tok = tokens.data_ptr<int64_t>();
  int64_t* tgt = targets.data_ptr<int64_t>();
  float* msk = mask.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const PromptAnswer& p = items[static_cast<size_t>(r)];
    std::vector<int64_t> ids = ArithmeticTokenizer::encode(p.prompt + p.answer);
    ids.push_back(ArithmeticTokenizer::kEos);
    const int64_t n = static_cast<int64_t>(ids.size());
    PTRAIN_CHECK(n <= len + 1, "prompt set: \"", p.prompt, p.answer, "\" takes ", n, " tokens, more than seq_length + 1");
    const int64_t promptLen = static_cast<int64_t>(p.prompt.size());
    for (int64_t t = 0; t < n; ++t) {
      if (t < len) tok[r * len + t] = ids[static_cast<size_t>(t)];
      if (t >= 1) tgt[r * len + t - 1] = ids[static_cast<size_t>(t)];
      if (t >= promptLen) msk[r * len + t - 1] = 1.0f;
    }
  }
  Batch batch;
  batch.tensors.emplace("tokens", tokens);
  batch.tensors.emplace("targets", targets);
  batch.tensors.emplace("loss_mask", mask);
  return batch;
}

}  // namespace ptrain::llm

#include "prompt_set.h"

#include <torch/torch.h>

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <numeric>

#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
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
  uint64_t offset = 0;  // of the line in the file
  for (; std::getline(in, line); offset += line.size() + 1) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    const nlohmann::json j = text::parseJsonLine(line, path, number, offset,
                                                 "one JSON object a line, e.g. {\"prompt\": \"12+7=\", \"answer\": \"19\"}");
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
    const int64_t tokens = static_cast<int64_t>(item.prompt.size() + item.answer.size()) + 1;
    if (tokens > longest_) {
      longest_ = tokens;
      longest_line_ = number;
    }
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
  // The set is in memory anyway; the last epoch asked is kept.
  thread_local std::vector<int64_t> order;
  thread_local int64_t cachedEpoch = -1, cachedSize = -1;
  thread_local uint64_t cachedSeed = 0;
  if (cachedEpoch != epoch || cachedSize != size || cachedSeed != seed) {
    order = datasets::epochPermutation(size, seed, epoch);
    cachedEpoch = epoch;
    cachedSize = size;
    cachedSeed = seed;
  }
  return order[static_cast<size_t>(pos)];
}

Batch promptBatch(const std::vector<PromptAnswer>& items, int64_t len) {
  std::vector<std::pair<std::string, std::string>> texts;
  texts.reserve(items.size());
  for (const auto& p : items) texts.emplace_back(p.prompt, p.answer);
  return datasets::promptAnswerBatch(texts, len);
}

}  // namespace ptrain::llm

// PromptSet: a user's own problems, JSONL of {"prompt": ..., "answer": ...}
// one a line (data.name: prompts), in the arithmetic vocabulary (digits and
// + - * =, datasets/arithmetic.h: the GPT's character tokenizer). The llm
// trainer learns answer-after-prompt from them (the loss on the answer and
// its EOS), the GRPO trainer samples responses to the prompts and rewards the
// exact answer (reward.h), and both score exact match on the validation file.
//
// Prompt sets are problem sets (GSM8K holds 7473), read whole into memory by
// every rank; a malformed line is one ConfigError "FILE:LINE: ...".
//
// Thread-safety: const methods may be called from several threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptrain/engine/batch.h"

namespace ptrain::llm {

struct PromptAnswer {
  std::string prompt;  // "12+7*3="
  std::string answer;  // "33"
};

class PromptSet {
 public:
  // Reads `path`. Throws ConfigError "FILE:LINE: ..." for a line that is not
  // an object with string "prompt" and "answer", a character outside the
  // vocabulary (naming it), an empty prompt or answer, or no line at all.
  explicit PromptSet(const std::string& path);

  const std::string& path() const { return path_; }
  int64_t size() const { return static_cast<int64_t>(items_.size()); }
  const PromptAnswer& at(int64_t i) const { return items_.at(static_cast<size_t>(i)); }
  const std::vector<PromptAnswer>& items() const { return items_; }
  // Tokens of the longest prompt + answer + EOS, and of the longest answer + EOS.
  int64_t longestTokens() const { return longest_; }
  int64_t longestAnswerTokens() const { return longest_answer_; }
  // The line (1-based) of the longest prompt + answer.
  int64_t longestLine() const { return longest_line_; }
  // The file's size and time, for a resume to tell it changed.
  nlohmann::json stamp() const;

 private:
  std::string path_;
  std::vector<PromptAnswer> items_;
  int64_t longest_ = 0;
  int64_t longest_answer_ = 0;
  int64_t longest_line_ = 0;
};

// Training order: item of sample `index` (step * global_batch + row), epoch
// after epoch; with `shuffle` each epoch is a permutation seeded by (seed,
// epoch), the same on every rank.
int64_t promptOrder(int64_t index, int64_t size, bool shuffle, uint64_t seed);

// tokens / targets [rows, seq_length] and loss_mask (1 on the answer and its
// EOS), as ArithmeticDataset::batchOf lays out its problems.
Batch promptBatch(const std::vector<PromptAnswer>& items, int64_t seq_length);

}  // namespace ptrain::llm

// Arithmetic text problems for language-model training: `347+85=432`.
//
// Each problem is `<lhs><op><rhs>=<answer><EOS>` written in a 16-symbol
// character vocabulary (PAD, EOS, digits, + - * =). Operands are drawn
// uniformly from [0, 10^digits); answers are exact integers in decimal, with a
// leading '-' when a subtraction goes negative.
//
// Determinism: problem i of training step s is generated from a splitmix64
// stream seeded by hash(seed, kTrainStream, s, i), so a global batch is a pure
// function of (seed, step, size) and every rank draws the same one, whatever
// the platform or standard library (no std:: distributions, no torch
// generator). Evaluation problems come from a different stream
// (hash(seed, kEvalStream, j)). They are NOT guaranteed to be absent from
// training: with small operand spaces (2-digit addition has 10^4 problems)
// training sees nearly every problem anyway, so exact match measures whether
// the model learned to compute the answers, not generalisation to unseen ones.
//
// Thread-safety: every const method may be called from several threads at once.
//
// Linked statically into the trainers that use it (ptrain_datasets), so its
// symbols stay hidden inside each plugin rather than exported from it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/engine/batch.h"

namespace ptrain::datasets {

enum class ArithmeticOp { kAdd, kSub, kMul };

// "add", "sub", "mul" -> op; std::nullopt for anything else.
std::optional<ArithmeticOp> arithmeticOpFromName(const std::string& name);
const char* arithmeticOpName(ArithmeticOp op);
// '+', '-', '*'.
char arithmeticOpSymbol(ArithmeticOp op);

// The character vocabulary. Ids are fixed: they are part of saved checkpoints.
class ArithmeticTokenizer {
 public:
  static constexpr int64_t kPad = 0;
  static constexpr int64_t kEos = 1;
  static constexpr int64_t kDigit0 = 2;  // '0'..'9' -> 2..11
  static constexpr int64_t kPlus = 12;
  static constexpr int64_t kMinus = 13;
  static constexpr int64_t kTimes = 14;
  static constexpr int64_t kEquals = 15;
  static constexpr int64_t kVocabSize = 16;

  // One id per character of `text` (digits and + - * = only; no EOS added).
  // Throws InternalError naming the first character outside the vocabulary.
  static std::vector<int64_t> encode(const std::string& text);
  // Characters of `ids` up to (not including) the first EOS; PAD is skipped.
  // Throws InternalError for an id outside [0, kVocabSize).
  static std::string decode(const std::vector<int64_t>& ids);
  // The printable form of one id: the character, "<pad>" or "<eos>".
  static std::string tokenText(int64_t id);
};

struct ArithmeticProblem {
  int64_t lhs = 0;
  int64_t rhs = 0;
  ArithmeticOp op = ArithmeticOp::kAdd;
  int64_t result = 0;  // lhs op rhs, exact

  // "347+85=" (what the model is prompted with).
  std::string prompt() const;
  // "432" (what it must produce before EOS).
  std::string answer() const;
  // prompt() + answer().
  std::string text() const;
  // encode(text()) followed by EOS.
  std::vector<int64_t> tokens() const;
};

struct ArithmeticOptions {
  std::vector<ArithmeticOp> operations{ArithmeticOp::kAdd};
  int64_t digits = 2;        // operands have up to this many digits, 1..9
  uint64_t seed = 0;         // selects the training and evaluation streams
  int64_t seq_length = 16;   // model input length; a problem with EOS takes up to seq_length + 1 tokens
  int64_t eval_size = 512;   // number of evaluation problems
};

// One thing wrong with a set of options, in recipe terms: the data.* / model.*
// key at fault and a one-line message ("data.digits=12 is out of range: use 1..9").
struct ArithmeticOptionsProblem {
  std::string key;
  std::string message;
};

class ArithmeticDataset {
 public:
  // Stream ids mixed into every problem's seed.
  static constexpr uint64_t kTrainStream = 0;
  static constexpr uint64_t kEvalStream = 1;

  // Throws ConfigError "<key>: <message>" for the first problem check() finds.
  explicit ArithmeticDataset(ArithmeticOptions options);
  ~ArithmeticDataset();

  // The first thing wrong with `options` (range of digits, an empty operation
  // list, a seq_length too short for the longest problem), or nullopt.
  static std::optional<ArithmeticOptionsProblem> check(const ArithmeticOptions& options);
  // Tokens of the longest problem the options can produce, EOS included.
  static int64_t maxProblemTokens(const std::vector<ArithmeticOp>& operations, int64_t digits);
  // The smallest seq_length that fits every problem: maxProblemTokens - 1.
  static int64_t minSeqLength(const std::vector<ArithmeticOp>& operations, int64_t digits);

  const ArithmeticOptions& options() const { return options_; }
  int64_t vocabSize() const { return ArithmeticTokenizer::kVocabSize; }

  // Problem `index` of training step `step` (pure function of seed, step, index).
  ArithmeticProblem trainProblem(int64_t step, int64_t index) const;
  // The global batch of `step`: problems 0..size-1 of that step. Each
  // problem's tokens (with EOS) are padded with PAD to seq_length + 1; then
  //   "tokens"    [size, seq_length] int64  row[:-1]
  //   "targets"   [size, seq_length] int64  row[1:]
  //   "loss_mask" [size, seq_length] float  1 where the target is an answer token or its EOS
  Batch trainBatch(int64_t step, int64_t size) const;
  // Rows [begin, end) of trainBatch(step, any size >= end): problems
  // begin..end-1 of that step, made alone.
  Batch trainRows(int64_t step, int64_t begin, int64_t end) const;
  // The evaluation problems (eval_size of them, from the evaluation stream).
  std::vector<ArithmeticProblem> evalProblems() const;
  // Any problems laid out like trainBatch().
  Batch batchOf(const std::vector<ArithmeticProblem>& problems) const;

 private:
  ArithmeticProblem generate(uint64_t problemSeed) const;

  ArithmeticOptions options_;
};

// Problems given as text (prompt, answer) laid out as trainBatch() lays out
// its own: tokens / targets [rows, seq_length] and loss_mask on the answer and
// its EOS. The one layout of every source of problems (the generator, a
// user's JSONL). Throws InternalError for a character outside the vocabulary
// or a problem longer than seq_length + 1 tokens (callers check both first).
Batch promptAnswerBatch(const std::vector<std::pair<std::string, std::string>>& problems, int64_t seq_length);

}  // namespace ptrain::datasets

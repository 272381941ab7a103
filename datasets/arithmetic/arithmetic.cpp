#include "ptrain/datasets/arithmetic.h"

#include "ptrain/datasets/splitmix.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace ptrain::datasets {
namespace {


int64_t pow10(int64_t digits) {
  int64_t p = 1;
  for (int64_t i = 0; i < digits; ++i) p *= 10;
  return p;
}

int64_t answerChars(ArithmeticOp op, int64_t digits) {
  switch (op) {
    case ArithmeticOp::kAdd: return digits + 1;  // 99+99=198
    case ArithmeticOp::kSub: return digits + 1;  // 0-99=-99
    case ArithmeticOp::kMul: return 2 * digits;  // 99*99=9801
  }
  return 0;
}

}  // namespace

std::optional<ArithmeticOp> arithmeticOpFromName(const std::string& name) {
  if (name == "add") return ArithmeticOp::kAdd;
  if (name == "sub") return ArithmeticOp::kSub;
  if (name == "mul") return ArithmeticOp::kMul;
  return std::nullopt;
}

const char* arithmeticOpName(ArithmeticOp op) {
  switch (op) {
    case ArithmeticOp::kAdd: return "add";
    case ArithmeticOp::kSub: return "sub";
    case ArithmeticOp::kMul: return "mul";
  }
  return "?";
}

char arithmeticOpSymbol(ArithmeticOp op) {
  switch (op) {
    case ArithmeticOp::kAdd: return '+';
    case ArithmeticOp::kSub: return '-';
    case ArithmeticOp::kMul: return '*';
  }
  return '?';
}

// ---- tokenizer ----

std::vector<int64_t> ArithmeticTokenizer::encode(const std::string& text) {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c >= '0' && c <= '9') {
      ids.push_back(kDigit0 + (c - '0'));
    } else if (c == '+') {
      ids.push_back(kPlus);
    } else if (c == '-') {
      ids.push_back(kMinus);
    } else if (c == '*') {
      ids.push_back(kTimes);
    } else if (c == '=') {
      ids.push_back(kEquals);
    } else {
      PTRAIN_CHECK(false, "arithmetic tokenizer: character '", c, "' at offset ", i, " of \"", text,
                   "\" is not in the vocabulary (digits and + - * =)");
    }
  }
  return ids;
}

std::string ArithmeticTokenizer::decode(const std::vector<int64_t>& ids) {
  std::string text;
  text.reserve(ids.size());
  for (int64_t id : ids) {
    PTRAIN_CHECK(id >= 0 && id < kVocabSize, "arithmetic tokenizer: id ", id, " is outside the vocabulary [0, ",
                 kVocabSize, ")");
    if (id == kEos) break;
    if (id == kPad) continue;
    if (id >= kDigit0 && id < kDigit0 + 10) {
      text.push_back(static_cast<char>('0' + (id - kDigit0)));
    } else {
      text.push_back("+-*="[id - kPlus]);
    }
  }
  return text;
}

std::string ArithmeticTokenizer::tokenText(int64_t id) {
  if (id == kPad) return "<pad>";
  if (id == kEos) return "<eos>";
  return decode({id});
}

// ---- problems ----

std::string ArithmeticProblem::prompt() const {
  return std::to_string(lhs) + arithmeticOpSymbol(op) + std::to_string(rhs) + "=";
}

std::string ArithmeticProblem::answer() const { return std::to_string(result); }

std::string ArithmeticProblem::text() const { return prompt() + answer(); }

std::vector<int64_t> ArithmeticProblem::tokens() const {
  std::vector<int64_t> ids = ArithmeticTokenizer::encode(text());
  ids.push_back(ArithmeticTokenizer::kEos);
  return ids;
}

// ---- dataset ----

ArithmeticDataset::ArithmeticDataset(ArithmeticOptions options) : options_(std::move(options)) {
  if (auto problem = check(options_)) throw ConfigError(problem->key + ": " + problem->message);
}

ArithmeticDataset::~ArithmeticDataset() = default;

int64_t ArithmeticDataset::maxProblemTokens(const std::vector<ArithmeticOp>& operations, int64_t digits) {
  int64_t longest = 0;
  for (ArithmeticOp op : operations) longest = std::max(longest, answerChars(op, digits));
  // lhs, op, rhs, '=', answer, EOS
  return digits + 1 + digits + 1 + longest + 1;
}

int64_t ArithmeticDataset::minSeqLength(const std::vector<ArithmeticOp>& operations, int64_t digits) {
  return maxProblemTokens(operations, digits) - 1;
}

std::optional<ArithmeticOptionsProblem> ArithmeticDataset::check(const ArithmeticOptions& o) {
  using detail::concat;
  if (o.digits < 1 || o.digits > 9) {
    // 9 is the most whose products (< 10^18) fit in int64.
    return ArithmeticOptionsProblem{"data.digits", concat(o.digits, " is out of range; use 1..9")};
  }
  if (o.operations.empty()) {
    return ArithmeticOptionsProblem{"data.operations", "the list is empty; use one or more of add, sub, mul"};
  }
  if (o.eval_size < 0) {
    return ArithmeticOptionsProblem{"data.eval_size", concat(o.eval_size, " is negative; use 0 or more")};
  }
  const int64_t need = minSeqLength(o.operations, o.digits);
  if (o.seq_length < need) {
    // Name the operation that needs the most room, so the fix is obvious.
    ArithmeticOp widest = o.operations.front();
    for (ArithmeticOp op : o.operations) {
      if (answerChars(op, o.digits) > answerChars(widest, o.digits)) widest = op;
    }
    return ArithmeticOptionsProblem{
        "model.seq_length",
        concat(o.seq_length, " is too short for ", o.digits, "-digit ", arithmeticOpName(widest),
               " problems (the longest takes ", need + 1, " tokens with EOS = seq_length + 1); use model.seq_length >= ",
               need)};
  }
  return std::nullopt;
}

ArithmeticProblem ArithmeticDataset::generate(uint64_t problemSeed) const {
  SplitMix64 rng(problemSeed);
  ArithmeticProblem p;
  p.op = options_.operations[rng.below(options_.operations.size())];
  const uint64_t limit = static_cast<uint64_t>(pow10(options_.digits));
  p.lhs = static_cast<int64_t>(rng.below(limit));
  p.rhs = static_cast<int64_t>(rng.below(limit));
  switch (p.op) {
    case ArithmeticOp::kAdd: p.result = p.lhs + p.rhs; break;
    case ArithmeticOp::kSub: p.result = p.lhs - p.rhs; break;
    case ArithmeticOp::kMul: p.result = p.lhs * p.rhs; break;
  }
  return p;
}

ArithmeticProblem ArithmeticDataset::trainProblem(int64_t step, int64_t index) const {
  uint64_t h = combine(mix64(options_.seed + kSplitMixGolden), kTrainStream);
  h = combine(h, static_cast<uint64_t>(step));
  return generate(combine(h, static_cast<uint64_t>(index)));
}

std::vector<ArithmeticProblem> ArithmeticDataset::evalProblems() const {
  const uint64_t h = combine(mix64(options_.seed + kSplitMixGolden), kEvalStream);
  std::vector<ArithmeticProblem> problems;
  problems.reserve(static_cast<size_t>(options_.eval_size));
  for (int64_t j = 0; j < options_.eval_size; ++j) problems.push_back(generate(combine(h, static_cast<uint64_t>(j))));
  return problems;
}

Batch ArithmeticDataset::trainBatch(int64_t step, int64_t size) const {
  PTRAIN_CHECK(size >= 0, "arithmetic dataset: batch size ", size, " is negative");
  return trainRows(step, 0, size);
}

Batch ArithmeticDataset::trainRows(int64_t step, int64_t begin, int64_t end) const {
  PTRAIN_CHECK(begin >= 0 && end >= begin, "arithmetic dataset: rows [", begin, ", ", end, ") of a batch");
  std::vector<ArithmeticProblem> problems;
  problems.reserve(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) problems.push_back(trainProblem(step, i));
  return batchOf(problems);
}

Batch ArithmeticDataset::batchOf(const std::vector<ArithmeticProblem>& problems) const {
  std::vector<std::pair<std::string, std::string>> texts;
  texts.reserve(problems.size());
  for (const auto& p : problems) texts.emplace_back(p.prompt(), p.answer());
  return promptAnswerBatch(texts, options_.seq_length);
}

Batch promptAnswerBatch(const std::vector<std::pair<std::string, std::string>>& problems, int64_t len) {
  const int64_t rows = static_cast<int64_t>(problems.size());
  at::Tensor tokens = torch::full({rows, len}, ArithmeticTokenizer::kPad, torch::kInt64);
  at::Tensor targets = torch::full({rows, len}, ArithmeticTokenizer::kPad, torch::kInt64);
  at::Tensor mask = torch::zeros({rows, len}, torch::kFloat32);
  int64_t* tok = tokens.data_ptr<int64_t>();
  int64_t* tgt = targets.data_ptr<int64_t>();
  float* msk = mask.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const auto& [prompt, answer] = problems[static_cast<size_t>(r)];
    std::vector<int64_t> ids = ArithmeticTokenizer::encode(prompt + answer);
    ids.push_back(ArithmeticTokenizer::kEos);
    const int64_t n = static_cast<int64_t>(ids.size());
    PTRAIN_CHECK(n <= len + 1, "arithmetic dataset: problem \"", prompt, answer, "\" takes ", n,
                 " tokens, more than seq_length + 1 = ", len + 1);
    // The row is ids padded to len + 1; inputs are its first len entries,
    // targets its last len. Answer tokens (and EOS) sit at [promptLen, n) of
    // the row, so at target positions [promptLen - 1, n - 1).
    const int64_t promptLen = static_cast<int64_t>(prompt.size());
    for (int64_t t = 0; t < n; ++t) {
      if (t < len) tok[r * len + t] = ids[t];
      if (t >= 1) tgt[r * len + t - 1] = ids[t];
      if (t >= promptLen) msk[r * len + t - 1] = 1.0f;
    }
  }
  Batch batch;
  batch.tensors.emplace("tokens", tokens);
  batch.tensors.emplace("targets", targets);
  batch.tensors.emplace("loss_mask", mask);
  return batch;
}

}  // namespace ptrain::datasets

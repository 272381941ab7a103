// The arithmetic dataset against integer arithmetic done here, hand-written
// token ids and hand-computed lengths.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "ptrain/datasets/arithmetic.h"

using ptrain::Batch;
using ptrain::ConfigError;
using ptrain::datasets::ArithmeticDataset;
using ptrain::datasets::ArithmeticOp;
using ptrain::datasets::ArithmeticOptions;
using ptrain::datasets::ArithmeticProblem;
using ptrain::datasets::ArithmeticTokenizer;

namespace {

ArithmeticOptions options(std::vector<ArithmeticOp> ops, int64_t digits, int64_t seqLength, uint64_t seed = 7) {
  ArithmeticOptions o;
  o.operations = std::move(ops);
  o.digits = digits;
  o.seq_length = seqLength;
  o.seed = seed;
  o.eval_size = 64;
  return o;
}

// Characters of row `r` of a batch: tokens[r, :] followed by the last target,
// with PAD and EOS spelled out, written independently of the tokenizer.
std::string rowText(const Batch& b, int64_t r) {
  static const char* kSymbols[] = {"_", "$", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "+", "-", "*", "="};
  const at::Tensor tokens = b.at("tokens")[r];
  const at::Tensor targets = b.at("targets")[r];
  const int64_t len = tokens.size(0);
  std::string s;
  for (int64_t t = 0; t < len; ++t) s += kSymbols[tokens[t].item<int64_t>()];
  s += kSymbols[targets[len - 1].item<int64_t>()];
  return s;
}

// Parses "a<op>b=c$" (EOS = '$') and checks c with 64-bit integers.
void expectCorrect(const std::string& text, int64_t digits) {
  const size_t eq = text.find('=');
  const size_t eos = text.find('$');
  ASSERT_NE(eq, std::string::npos) << text;
  ASSERT_NE(eos, std::string::npos) << text;
  ASSERT_LT(eq, eos) << text;
  // The operator is the first symbol after the first character (lhs is never negative).
  const size_t opPos = text.find_first_of("+-*", 1);
  ASSERT_LT(opPos, eq) << text;
  const std::string lhs = text.substr(0, opPos);
  const std::string rhs = text.substr(opPos + 1, eq - opPos - 1);
  const std::string ans = text.substr(eq + 1, eos - eq - 1);
  ASSERT_FALSE(lhs.empty());
  ASSERT_FALSE(rhs.empty());
  ASSERT_FALSE(ans.empty());
  EXPECT_LE(static_cast<int64_t>(lhs.size()), digits) << text;
  EXPECT_LE(static_cast<int64_t>(rhs.size()), digits) << text;
  // No leading zeros: numbers are written as std::to_string would.
  EXPECT_TRUE(lhs.size() == 1 || lhs[0] != '0') << text;
  EXPECT_TRUE(rhs.size() == 1 || rhs[0] != '0') << text;
  const long long a = std::stoll(lhs), b = std::stoll(rhs), c = std::stoll(ans);
  long long expected = 0;
  switch (text[opPos]) {
    case '+': expected = a + b; break;
    case '-': expected = a - b; break;
    case '*': expected = a * b; break;
  }
  EXPECT_EQ(c, expected) << text;
  // After EOS only padding.
  for (size_t i = eos + 1; i < text.size(); ++i) EXPECT_EQ(text[i], '_') << text;
}

}  // namespace

TEST(ArithmeticTokenizer, HandWrittenIds) {
  // '0'..'9' -> 2..11, + 12, - 13, * 14, = 15.
  EXPECT_EQ(ArithmeticTokenizer::encode("12+34=46"), (std::vector<int64_t>{3, 4, 12, 5, 6, 15, 6, 8}));
  EXPECT_EQ(ArithmeticTokenizer::encode("9-70=-61"), (std::vector<int64_t>{11, 13, 9, 2, 15, 13, 8, 3}));
  EXPECT_EQ(ArithmeticTokenizer::encode("0*5=0"), (std::vector<int64_t>{2, 14, 7, 15, 2}));
  EXPECT_EQ(ArithmeticTokenizer::kVocabSize, 16);
}

TEST(ArithmeticTokenizer, RoundTripStopsAtEosAndSkipsPad) {
  for (const std::string s : {"347+85=432", "3-5=-2", "99*99=9801", "0+0=0", "1234567890+-*="}) {
    EXPECT_EQ(ArithmeticTokenizer::decode(ArithmeticTokenizer::encode(s)), s);
  }
  // "7+1=8" EOS then garbage that must be ignored; PAD inside is skipped.
  EXPECT_EQ(ArithmeticTokenizer::decode({9, 12, 0, 3, 15, 10, 1, 5, 5}), "7+1=8");
  EXPECT_EQ(ArithmeticTokenizer::tokenText(0), "<pad>");
  EXPECT_EQ(ArithmeticTokenizer::tokenText(1), "<eos>");
  EXPECT_EQ(ArithmeticTokenizer::tokenText(14), "*");
  EXPECT_THROW(ArithmeticTokenizer::encode("1/2"), ptrain::InternalError);
  EXPECT_THROW(ArithmeticTokenizer::decode({16}), ptrain::InternalError);
}

TEST(ArithmeticDataset, ProblemText) {
  ArithmeticProblem p;
  p.lhs = 347;
  p.rhs = 85;
  p.op = ArithmeticOp::kAdd;
  p.result = 432;
  EXPECT_EQ(p.prompt(), "347+85=");
  EXPECT_EQ(p.answer(), "432");
  EXPECT_EQ(p.tokens(), (std::vector<int64_t>{5, 6, 9, 12, 10, 7, 15, 6, 5, 4, 1}));
}

TEST(ArithmeticDataset, SameSeedAndStepGiveTheSameBatch) {
  ArithmeticDataset a(options({ArithmeticOp::kAdd, ArithmeticOp::kSub, ArithmeticOp::kMul}, 3, 14));
  ArithmeticDataset b(options({ArithmeticOp::kAdd, ArithmeticOp::kSub, ArithmeticOp::kMul}, 3, 14));
  Batch x = a.trainBatch(5, 32);
  Batch y = b.trainBatch(5, 32);
  for (const char* name : {"tokens", "targets", "loss_mask"}) {
    EXPECT_TRUE(torch::equal(x.at(name), y.at(name))) << name;
  }
  // Row i depends on (seed, step, i) only: a smaller batch is a prefix.
  Batch prefix = a.trainBatch(5, 8);
  EXPECT_TRUE(torch::equal(prefix.at("tokens"), x.at("tokens").narrow(0, 0, 8)));
  // Another step or another seed: other problems.
  EXPECT_FALSE(torch::equal(a.trainBatch(6, 32).at("tokens"), x.at("tokens")));
  ArithmeticDataset c(options({ArithmeticOp::kAdd, ArithmeticOp::kSub, ArithmeticOp::kMul}, 3, 14, /*seed=*/8));
  EXPECT_FALSE(torch::equal(c.trainBatch(5, 32).at("tokens"), x.at("tokens")));
}

TEST(ArithmeticDataset, BatchLayout) {
  ArithmeticDataset ds(options({ArithmeticOp::kAdd}, 2, 12));
  Batch b = ds.trainBatch(0, 16);
  EXPECT_EQ(b.at("tokens").sizes(), (std::vector<int64_t>{16, 12}));
  EXPECT_EQ(b.at("targets").sizes(), (std::vector<int64_t>{16, 12}));
  EXPECT_EQ(b.at("loss_mask").sizes(), (std::vector<int64_t>{16, 12}));
  EXPECT_EQ(b.at("tokens").scalar_type(), torch::kInt64);
  EXPECT_EQ(b.at("targets").scalar_type(), torch::kInt64);
  EXPECT_EQ(b.at("loss_mask").scalar_type(), torch::kFloat32);
  // targets are tokens shifted left by one.
  EXPECT_TRUE(torch::equal(b.at("targets").narrow(1, 0, 11), b.at("tokens").narrow(1, 1, 11)));
}

TEST(ArithmeticDataset, EveryAnswerIsRightForEveryOperationAndWidth) {
  for (int64_t digits = 1; digits <= 9; ++digits) {
    // Longest: mul, d + 1 + d + 1 + 2d + 1 tokens -> seq_length 4d + 2.
    ArithmeticDataset ds(options({ArithmeticOp::kAdd, ArithmeticOp::kSub, ArithmeticOp::kMul}, digits, 4 * digits + 2));
    for (int64_t step = 0; step < 3; ++step) {
      Batch b = ds.trainBatch(step, 64);
      for (int64_t r = 0; r < 64; ++r) expectCorrect(rowText(b, r), digits);
    }
  }
}

TEST(ArithmeticDataset, EveryOperationAndOperandValueOccurs) {
  ArithmeticDataset ds(options({ArithmeticOp::kAdd, ArithmeticOp::kSub, ArithmeticOp::kMul}, 1, 6));
  std::set<char> ops;
  std::set<int64_t> lhs, rhs;
  bool negative = false;
  for (int64_t i = 0; i < 400; ++i) {
    ArithmeticProblem p = ds.trainProblem(3, i);
    ops.insert(ptrain::datasets::arithmeticOpSymbol(p.op));
    lhs.insert(p.lhs);
    rhs.insert(p.rhs);
    negative = negative || p.result < 0;
  }
  EXPECT_EQ(ops, (std::set<char>{'+', '-', '*'}));
  EXPECT_EQ(lhs.size(), 10u);
  EXPECT_EQ(rhs.size(), 10u);
  EXPECT_TRUE(negative);
}

TEST(ArithmeticDataset, LossMaskCoversExactlyTheAnswerAndEos) {
  ArithmeticDataset ds(options({ArithmeticOp::kSub, ArithmeticOp::kMul}, 3, 14));
  Batch b = ds.trainBatch(2, 64);
  const at::Tensor mask = b.at("loss_mask");
  for (int64_t r = 0; r < 64; ++r) {
    const std::string text = rowText(b, r);  // text[t + 1] is the target at position t
    const int64_t eq = static_cast<int64_t>(text.find('='));
    const int64_t eos = static_cast<int64_t>(text.find('$'));
    for (int64_t t = 0; t < 14; ++t) {
      const bool answer = t + 1 > eq && t + 1 <= eos;
      EXPECT_EQ(mask[r][t].item<float>(), answer ? 1.0f : 0.0f) << text << " position " << t;
    }
  }
}

TEST(ArithmeticDataset, LongestProblemFitsExactly) {
  // 2-digit add: "99+99=198" + EOS = 10 tokens -> seq_length 9.
  EXPECT_EQ(ArithmeticDataset::maxProblemTokens({ArithmeticOp::kAdd}, 2), 10);
  EXPECT_EQ(ArithmeticDataset::minSeqLength({ArithmeticOp::kAdd}, 2), 9);
  // "0-99=-99" + EOS is 9 tokens, but the bound is the same form: 2d + 2 + (d + 1) + 1 = 10.
  EXPECT_EQ(ArithmeticDataset::minSeqLength({ArithmeticOp::kSub}, 2), 9);
  // 3-digit mul: "999*999=998001" + EOS = 15 tokens.
  EXPECT_EQ(ArithmeticDataset::maxProblemTokens({ArithmeticOp::kAdd, ArithmeticOp::kMul}, 3), 15);
  // At the minimum, a full row ends with EOS as its last target.
  ArithmeticDataset ds(options({ArithmeticOp::kMul}, 1, 6));  // "9*9=81" + EOS = 7 tokens
  EXPECT_TRUE(ArithmeticDataset::check(options({ArithmeticOp::kMul}, 1, 5)).has_value());
  ArithmeticProblem p;
  p.lhs = 9;
  p.rhs = 9;
  p.op = ArithmeticOp::kMul;
  p.result = 81;
  Batch b = ds.batchOf({p});
  EXPECT_TRUE(torch::equal(b.at("tokens")[0], torch::tensor({11, 14, 11, 15, 10, 3}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(b.at("targets")[0], torch::tensor({14, 11, 15, 10, 3, 1}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(b.at("loss_mask")[0], torch::tensor({0.f, 0.f, 0.f, 1.f, 1.f, 1.f})));
}

TEST(ArithmeticDataset, EvalProblemsComeFromTheirOwnStream) {
  ArithmeticOptions o = options({ArithmeticOp::kAdd}, 4, 15);  // "9999+9999=19998" + EOS
  o.eval_size = 100;
  ArithmeticDataset ds(o);
  auto eval = ds.evalProblems();
  ASSERT_EQ(eval.size(), 100u);
  auto again = ArithmeticDataset(o).evalProblems();
  for (size_t i = 0; i < eval.size(); ++i) {
    EXPECT_EQ(eval[i].text(), again[i].text());
    EXPECT_EQ(eval[i].result, eval[i].lhs + eval[i].rhs);
  }
  // With 10^8 possible problems, the evaluation stream does not repeat the
  // first training step (a collision would be a one in a million event).
  std::set<std::string> train;
  for (int64_t i = 0; i < 100; ++i) train.insert(ds.trainProblem(0, i).text());
  int same = 0;
  for (const auto& p : eval) same += train.count(p.text()) ? 1 : 0;
  EXPECT_EQ(same, 0);
}

TEST(ArithmeticDataset, ChecksSayWhichKeyAndWhatFits) {
  auto problem = ArithmeticDataset::check(options({ArithmeticOp::kAdd}, 12, 40));
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->key, "data.digits");
  EXPECT_EQ(problem->message, "12 is out of range; use 1..9");

  problem = ArithmeticDataset::check(options({}, 2, 9));
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->key, "data.operations");

  // 3-digit mul needs 15 tokens with EOS -> seq_length >= 14.
  problem = ArithmeticDataset::check(options({ArithmeticOp::kAdd, ArithmeticOp::kMul}, 3, 10));
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->key, "model.seq_length");
  EXPECT_NE(problem->message.find("10 is too short for 3-digit mul"), std::string::npos) << problem->message;
  EXPECT_NE(problem->message.find("use model.seq_length >= 14"), std::string::npos) << problem->message;
  EXPECT_EQ(problem->message.find('\n'), std::string::npos);

  EXPECT_FALSE(ArithmeticDataset::check(options({ArithmeticOp::kAdd, ArithmeticOp::kMul}, 3, 14)).has_value());

  try {
    ArithmeticDataset bad(options({ArithmeticOp::kAdd}, 0, 9));
    FAIL() << "digits 0 accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "data.digits: 0 is out of range; use 1..9");
  }
}

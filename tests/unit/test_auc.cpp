// rocAuc and logLoss (datasets/clicks/auc.cpp) against hand-computed cases,
// scikit-learn's documented example and a brute-force count over every
// positive-negative pair.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "ptrain/datasets/auc.h"
#include "ptrain/datasets/splitmix.h"

using ptrain::datasets::logLoss;
using ptrain::datasets::rocAuc;

namespace {

// U / (P N) over every positive-negative pair, ties counting one half.
double pairAuc(const std::vector<double>& scores, const std::vector<double>& labels) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    for (size_t j = 0; j < scores.size(); ++j) {
      if (labels[i] != 1 || labels[j] != 0) continue;
      pairs += 1;
      wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
    }
  }
  return wins / pairs;
}

template <typename F>
std::string invalidArgumentMessage(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument thrown)";
}

}  // namespace

// scikit-learn's roc_auc_score docstring example: 3 of the 4 pairs ordered.
TEST(Auc, ScikitLearnExample) {
  EXPECT_DOUBLE_EQ(rocAuc(std::vector<double>{0.1, 0.4, 0.35, 0.8}, std::vector<double>{0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(rocAuc(std::vector<float>{0.1f, 0.4f, 0.35f, 0.8f}, std::vector<float>{0, 0, 1, 1}), 0.75);
}

// Positives {0.5, 0.5, 0.9}, negatives {0.1, 0.5}: of the 6 pairs, 4 are
// ordered and 2 tied at 0.5 count one half each: 5 / 6.
TEST(Auc, TiesCountHalf) {
  EXPECT_DOUBLE_EQ(rocAuc(std::vector<double>{0.1, 0.5, 0.5, 0.5, 0.9}, std::vector<double>{0, 0, 1, 1, 1}), 5.0 / 6.0);
  // The order of the samples inside a tie group does not matter.
  EXPECT_DOUBLE_EQ(rocAuc(std::vector<double>{0.5, 0.9, 0.5, 0.1, 0.5}, std::vector<double>{1, 1, 0, 0, 1}), 5.0 / 6.0);
  // One positive tied with one negative, another above both: (1 + 0.5 + 1 + 1) / 4.
  EXPECT_DOUBLE_EQ(rocAuc(std::vector<double>{0.2, 0.2, 0.7, 0.1}, std::vector<double>{1, 0, 1, 0}), 3.5 / 4.0);
}

TEST(Auc, AllEqualScoresGiveHalf) {
  EXPECT_DOUBLE_EQ(rocAuc(std::vector<double>{0.3, 0.3, 0.3, 0.3, 0.3}, std::vector<double>{1, 0, 0, 1, 0}), 0.5);
}

TEST(Auc, PerfectAndReversed) {
  const std::vector<double> labels{0, 0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(rocAuc(std::vector<double>{0.1, 0.2, 0.3, 0.4, 0.5}, labels), 1.0);
  EXPECT_DOUBLE_EQ(rocAuc(std::vector<double>{0.5, 0.4, 0.3, 0.2, 0.1}, labels), 0.0);
  // Scores need not be probabilities: any finite values, only their order counts.
  EXPECT_DOUBLE_EQ(rocAuc(std::vector<double>{-30, -2, 0, 7, 1e9}, labels), 1.0);
}

TEST(Auc, MatchesEveryPairCounted) {
  ptrain::datasets::SplitMix64 rng(42);
  for (int trial = 0; trial < 20; ++trial) {
    const size_t n = 50 + rng.below(300);
    std::vector<double> scores(n), labels(n);
    std::vector<float> scoresF(n), labelsF(n);
    labels[0] = 0;
    labels[1] = 1;
    for (size_t i = 0; i < n; ++i) {
      // Scores on a grid of 11 values: many ties.
      scores[i] = static_cast<double>(rng.below(11)) / 10.0;
      if (i >= 2) labels[i] = static_cast<double>(rng.below(2));
      scoresF[i] = static_cast<float>(scores[i]);
      labelsF[i] = static_cast<float>(labels[i]);
    }
    const double expected = pairAuc(scores, labels);
    EXPECT_NEAR(rocAuc(scores, labels), expected, 1e-12) << "trial " << trial;
    EXPECT_NEAR(rocAuc(scoresF, labelsF), expected, 1e-12) << "trial " << trial;
  }
}

TEST(Auc, OneClassThrows) {
  const std::string ones = invalidArgumentMessage(
      [] { rocAuc(std::vector<double>{0.1, 0.2}, std::vector<double>{1, 1}); });
  EXPECT_NE(ones.find("only one class"), std::string::npos) << ones;
  EXPECT_NE(ones.find("all 1"), std::string::npos) << ones;
  const std::string zeros = invalidArgumentMessage(
      [] { rocAuc(std::vector<double>{0.1, 0.2}, std::vector<double>{0, 0}); });
  EXPECT_NE(zeros.find("only one class"), std::string::npos) << zeros;
}

TEST(Auc, BadInputsThrow) {
  const std::string label = invalidArgumentMessage(
      [] { rocAuc(std::vector<double>{0.1, 0.2, 0.3}, std::vector<double>{0, 2, 1}); });
  EXPECT_NE(label.find("label 2 at index 1 is not 0 or 1"), std::string::npos) << label;
  const std::string nan = invalidArgumentMessage([] {
    rocAuc(std::vector<double>{0.1, std::nan(""), 0.3}, std::vector<double>{0, 1, 1});
  });
  EXPECT_NE(nan.find("at index 1 is not finite"), std::string::npos) << nan;
  const std::string sizes = invalidArgumentMessage(
      [] { rocAuc(std::vector<double>{0.1, 0.2}, std::vector<double>{0, 1, 1}); });
  EXPECT_NE(sizes.find("2 scores but 3 labels"), std::string::npos) << sizes;
  const std::string empty = invalidArgumentMessage([] { rocAuc(std::vector<double>{}, std::vector<double>{}); });
  EXPECT_NE(empty.find("no samples"), std::string::npos) << empty;
}

TEST(LogLoss, HandComputed) {
  // -(ln 0.9 + ln(1 - 0.2) + ln 0.6) / 3
  const double expected = -(std::log(0.9) + std::log(0.8) + std::log(0.6)) / 3;
  EXPECT_NEAR(logLoss(std::vector<double>{0.9, 0.2, 0.6}, std::vector<double>{1, 0, 1}), expected, 1e-15);
  EXPECT_NEAR(logLoss(std::vector<float>{0.9f, 0.2f, 0.6f}, std::vector<float>{1, 0, 1}), expected, 1e-7);
  // One class is fine for the loss (scikit-learn would want `labels`).
  EXPECT_NEAR(logLoss(std::vector<double>{0.5, 0.5}, std::vector<double>{1, 1}), std::log(2.0), 1e-15);
}

// Certain and wrong costs -log(eps) of the input's type, not infinity.
TEST(LogLoss, ClipsAtTheTypesEpsilon) {
  EXPECT_NEAR(logLoss(std::vector<double>{0.0, 1.0}, std::vector<double>{1, 0}),
              -std::log(std::numeric_limits<double>::epsilon()), 1e-9);
  EXPECT_NEAR(logLoss(std::vector<float>{0.0f, 1.0f}, std::vector<float>{1, 0}),
              -std::log(static_cast<double>(std::numeric_limits<float>::epsilon())), 1e-5);
  // Certain and right costs (almost) nothing.
  EXPECT_LT(logLoss(std::vector<double>{1.0, 0.0}, std::vector<double>{1, 0}), 1e-15);
}

TEST(LogLoss, BadInputsThrow) {
  const std::string above = invalidArgumentMessage(
      [] { logLoss(std::vector<double>{0.5, 1.5}, std::vector<double>{0, 1}); });
  EXPECT_NE(above.find("probability 1.5 at index 1 is outside [0, 1]"), std::string::npos) << above;
  const std::string label = invalidArgumentMessage(
      [] { logLoss(std::vector<double>{0.5, 0.5}, std::vector<double>{0, -1}); });
  EXPECT_NE(label.find("is not 0 or 1"), std::string::npos) << label;
  const std::string sizes = invalidArgumentMessage(
      [] { logLoss(std::vector<double>{0.5}, std::vector<double>{0, 1}); });
  EXPECT_NE(sizes.find("logLoss: 1 scores but 2 labels"), std::string::npos) << sizes;
}

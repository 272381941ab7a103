// The clicks dataset (datasets/clicks) against Zipf's law summed here,
// bounds from the options, and the hidden model's own probabilities.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

#include "ptrain/datasets/clicks.h"
#include "ptrain/engine/batch.h"

using ptrain::Batch;
using ptrain::ConfigError;
using ptrain::datasets::ClicksBestScores;
using ptrain::datasets::ClicksDataset;
using ptrain::datasets::ClicksExamples;
using ptrain::datasets::ClicksOptions;
using ptrain::datasets::ClicksSample;
using ptrain::datasets::ClicksSplit;
using ptrain::datasets::kClicksDenseFeatures;
using ptrain::datasets::kClicksSparseFeatures;
using ptrain::datasets::SplitMix64;
using ptrain::datasets::ZipfSampler;
using ptrain::datasets::zipfHarmonic;

namespace {

ClicksOptions seeded(uint64_t seed) {
  ClicksOptions o;
  o.seed = seed;
  o.validation_size = 20000;
  return o;
}

bool sameSample(const ClicksSample& a, const ClicksSample& b) {
  return a.sparse == b.sparse && a.counts == b.counts && a.history == b.history &&
         a.history_length == b.history_length && a.probability == b.probability && a.label == b.label;
}

// Resident memory of this process in MB (Linux /proc/self/statm).
double residentMb() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

// Frequency of rank r among `draws` Zipf draws against (r + 1)^-s / H(n, s),
// within 5 binomial standard deviations.
void expectZipfHead(int64_t n, double s, int draws) {
  const ZipfSampler zipf(n, s);
  SplitMix64 rng(99);
  std::vector<int64_t> hits(3, 0);
  for (int i = 0; i < draws; ++i) {
    const int64_t r = zipf.sample(rng);
    ASSERT_GE(r, 0);
    ASSERT_LT(r, n);
    if (r < 3) ++hits[static_cast<size_t>(r)];
  }
  const double harmonic = zipfHarmonic(n, s);
  for (int64_t r = 0; r < std::min<int64_t>(3, n); ++r) {
    const double p = std::pow(static_cast<double>(r + 1), -s) / harmonic;
    const double sd = std::sqrt(p * (1 - p) / draws);
    EXPECT_NEAR(static_cast<double>(hits[r]) / draws, p, 5 * sd) << "n=" << n << " s=" << s << " rank " << r;
  }
}

}  // namespace

TEST(ClicksZipf, HeadFrequenciesMatchZipfsLaw) {
  expectZipfHead(1000, 1.1, 200000);
  expectZipfHead(1000, 1.0, 200000);  // s = 1: the helpers' limits at 0
  expectZipfHead(50, 1.2, 200000);
  expectZipfHead(2, 1.05, 100000);
}

TEST(ClicksZipf, OneRowAndHugeTables) {
  const ZipfSampler one(1, 1.1);
  SplitMix64 rng(3);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(one.sample(rng), 0);
  // 1e8 rows cost a few doubles; the tail is reached: P(rank >= 1e6) is about 0.1.
  const int64_t n = 100000000;
  const ZipfSampler huge(n, 1.1);
  int64_t beyond = 0, head = 0;
  for (int i = 0; i < 20000; ++i) {
    const int64_t r = huge.sample(rng);
    ASSERT_GE(r, 0);
    ASSERT_LT(r, n);
    beyond += r >= 1000000;
    head += r == 0;
  }
  EXPECT_GT(beyond, 1400);
  EXPECT_LT(beyond, 2600);
  // H(1e8, 1.1) ~ zeta(1.1) - 1e8^-0.1 / 0.1 = 10.584 - 1.585 = 9.0.
  EXPECT_NEAR(head / 20000.0, 1 / 9.0, 0.012);
  EXPECT_THROW(ZipfSampler(0, 1.1), ConfigError);
  EXPECT_THROW(ZipfSampler(10, 0.0), ConfigError);
}

TEST(ClicksDataset, SameIndexSameSampleAndSeedsDiffer) {
  const ClicksDataset a(seeded(1)), b(seeded(1)), c(seeded(2));
  int differ = 0;
  for (int64_t i = 0; i < 32; ++i) {
    const ClicksSample s = a.sample(ClicksSplit::kTrain, i);
    EXPECT_TRUE(sameSample(s, a.sample(ClicksSplit::kTrain, i))) << i;
    EXPECT_TRUE(sameSample(s, b.sample(ClicksSplit::kTrain, i))) << i;
    differ += !sameSample(s, c.sample(ClicksSplit::kTrain, i));
    EXPECT_FALSE(sameSample(s, a.sample(ClicksSplit::kTrain, i + 1))) << i;
  }
  EXPECT_EQ(differ, 32);
}

// The validation set and the hidden model depend on the world, not on the
// training seed; another world changes the model.
TEST(ClicksDataset, ValidationIndependentOfTrainingSeed) {
  const ClicksDataset a(seeded(1)), b(seeded(12345));
  EXPECT_DOUBLE_EQ(a.bias(), b.bias());
  EXPECT_DOUBLE_EQ(a.logitScale(), b.logitScale());
  for (int64_t i = 0; i < 32; ++i) {
    EXPECT_TRUE(sameSample(a.sample(ClicksSplit::kValidation, i), b.sample(ClicksSplit::kValidation, i))) << i;
  }
  ClicksOptions other = seeded(1);
  other.world_seed = 77;
  const ClicksDataset w(other);
  int differ = 0;
  for (int64_t i = 0; i < 32; ++i) {
    differ += a.sample(ClicksSplit::kValidation, i).probability != w.sample(ClicksSplit::kValidation, i).probability;
  }
  EXPECT_EQ(differ, 32);
}

// Every field within what the options allow; category and interest fixed by
// item and user; dense features Criteo-like (non-negative counts, some zero).
TEST(ClicksDataset, FeaturesWithinTheirRanges) {
  ClicksOptions o = seeded(5);
  for (int64_t t = 0; t < kClicksSparseFeatures; ++t) o.table_sizes[t] = 1 + 37 * t;  // 1 .. 926 rows
  o.table_sizes[1] = 300;  // items
  o.history_length = 5;
  o.min_history = 2;
  const ClicksDataset ds(o);
  const ClicksExamples e = ds.examples(ClicksSplit::kTrain, 1000, 3000);
  ASSERT_EQ(e.count, 3000);
  ASSERT_EQ(e.history_length, 5);
  std::map<int64_t, int64_t> categoryOf, interestOf;
  std::vector<int64_t> lengthSeen(6, 0);
  int64_t zeros = 0, clicks = 0;
  for (int64_t r = 0; r < e.count; ++r) {
    const int64_t* sparse = &e.sparse[r * kClicksSparseFeatures];
    for (int64_t t = 0; t < kClicksSparseFeatures; ++t) {
      ASSERT_GE(sparse[t], 0);
      ASSERT_LT(sparse[t], o.table_sizes[t]) << "feature " << t;
    }
    EXPECT_EQ(categoryOf.emplace(sparse[1], sparse[2]).first->second, sparse[2]) << "item " << sparse[1];
    EXPECT_EQ(interestOf.emplace(sparse[0], sparse[3]).first->second, sparse[3]) << "user " << sparse[0];
    for (int64_t j = 0; j < kClicksDenseFeatures; ++j) {
      const float x = e.dense[r * kClicksDenseFeatures + j];
      ASSERT_GE(x, 0.0f);
      ASSERT_LT(x, 25.0f);  // log(1 + count) of counts below ~1e10
      zeros += x == 0.0f;
    }
    const int64_t length = e.history_lengths[r];
    ASSERT_GE(length, 2);
    ASSERT_LE(length, 5);
    ++lengthSeen[static_cast<size_t>(length)];
    for (int64_t h = 0; h < 5; ++h) {
      const int64_t item = e.history[r * 5 + h];
      if (h < length) {
        EXPECT_GE(item, 0);
        EXPECT_LT(item, 300);
      } else {
        EXPECT_EQ(item, -1);
      }
    }
    const double p = e.probabilities[r];
    EXPECT_GT(p, 0.0);
    EXPECT_LT(p, 1.0);
    ASSERT_TRUE(e.labels[r] == 0.0f || e.labels[r] == 1.0f);
    clicks += e.labels[r] == 1.0f;
  }
  for (int64_t length = 2; length <= 5; ++length) EXPECT_GT(lengthSeen[length], 500) << length;
  // Each feature is zero 5-45 % of the time.
  EXPECT_GT(zeros, e.count * kClicksDenseFeatures / 20);
  EXPECT_LT(zeros, e.count * kClicksDenseFeatures / 2);
  EXPECT_GT(clicks, 0);
}

// A plain Zipf feature of the samples: id 0 about 1 / H(n, s) of the time.
TEST(ClicksDataset, ZipfHeadFrequencyInSamples) {
  ClicksOptions o = seeded(9);
  o.table_sizes[4] = 1000;
  o.zipf_exponent = 1.15;
  const ClicksDataset ds(o);
  const int64_t n = 4000;
  const ClicksExamples e = ds.examples(ClicksSplit::kTrain, 0, n);
  int64_t head = 0;
  for (int64_t r = 0; r < n; ++r) head += e.sparse[r * kClicksSparseFeatures + 4] == 0;
  const double p = 1 / zipfHarmonic(1000, 1.15);
  EXPECT_NEAR(static_cast<double>(head) / n, p, 5 * std::sqrt(p * (1 - p) / n));
}

// Batch = examples = sample, row by row; shapes and dtypes as documented.
TEST(ClicksDataset, BatchMatchesSamples) {
  const ClicksDataset ds(seeded(3));
  const int64_t first = 500, count = 200, hl = ds.options().history_length;
  const Batch b = ds.batch(ClicksSplit::kTrain, first, count);
  const ClicksExamples e = ds.examples(ClicksSplit::kTrain, first, count);
  EXPECT_EQ(b.size(), count);
  EXPECT_EQ(b.at("sparse").sizes(), (std::vector<int64_t>{count, kClicksSparseFeatures}));
  EXPECT_EQ(b.at("dense").sizes(), (std::vector<int64_t>{count, kClicksDenseFeatures}));
  EXPECT_EQ(b.at("history").sizes(), (std::vector<int64_t>{count, hl}));
  EXPECT_EQ(b.at("history_mask").sizes(), (std::vector<int64_t>{count, hl}));
  EXPECT_EQ(b.at("sparse").scalar_type(), torch::kInt64);
  EXPECT_EQ(b.at("dense").scalar_type(), torch::kFloat32);
  EXPECT_EQ(b.at("labels").scalar_type(), torch::kFloat32);
  EXPECT_EQ(b.at("probabilities").scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(b.at("sparse"), torch::tensor(e.sparse).view({count, kClicksSparseFeatures})));
  EXPECT_TRUE(torch::equal(b.at("dense"), torch::tensor(e.dense).view({count, kClicksDenseFeatures})));
  EXPECT_TRUE(torch::equal(b.at("history"), torch::tensor(e.history).view({count, hl})));
  EXPECT_TRUE(torch::equal(b.at("history_lengths"), torch::tensor(e.history_lengths)));
  EXPECT_TRUE(torch::equal(b.at("labels"), torch::tensor(e.labels)));
  EXPECT_TRUE(torch::equal(b.at("history_mask").sum(1).to(torch::kInt64), b.at("history_lengths")));
  EXPECT_TRUE(torch::equal(b.at("item_categories"), b.at("sparse").select(1, ds.options().category_feature)));
  EXPECT_TRUE(torch::equal(b.at("user_interests"), b.at("sparse").select(1, ds.options().interest_feature)));
  for (int64_t r : {int64_t{0}, int64_t{77}, count - 1}) {
    const ClicksSample s = ds.sample(ClicksSplit::kTrain, first + r);
    EXPECT_EQ(s.label, b.at("labels")[r].item<float>());
    EXPECT_FLOAT_EQ(static_cast<float>(s.probability), b.at("probabilities")[r].item<float>());
    EXPECT_EQ(s.probability, e.probabilities[r]);
    EXPECT_EQ(s.probability, ds.probability(s));
    EXPECT_EQ(s.item_category, s.sparse[2]);
    EXPECT_EQ(s.user_interest, s.sparse[3]);
  }
}

// The click rate is what the bias was calibrated for, labels follow the
// probabilities, and the ground truth's AUC leaves room above a coin and
// below certainty.
TEST(ClicksDataset, ClickRateAndBestAuc) {
  const ClicksDataset ds(seeded(1));
  const ClicksBestScores best = ds.bestValidationScores();
  EXPECT_EQ(best.samples, 20000);
  EXPECT_GE(best.click_rate, 0.15);
  EXPECT_LE(best.click_rate, 0.35);
  EXPECT_NEAR(best.mean_probability, ds.options().click_rate, 0.02);
  EXPECT_NEAR(best.click_rate, best.mean_probability, 0.015);  // 5 sd of a mean of 20000 draws
  EXPECT_GT(best.auc, 0.7);
  EXPECT_LT(best.auc, 0.9);
  // Better than the constant predictor's entropy of the click rate.
  const double rate = best.click_rate;
  EXPECT_LT(best.logloss, -(rate * std::log(rate) + (1 - rate) * std::log(1 - rate)) - 0.05);
  EXPECT_NEAR(best.logloss, best.expected_logloss, 0.02);
  const std::string line = ptrain::datasets::clicksBestScoresLine(best);
  EXPECT_NE(line.find("ground truth on 20000 validation samples: AUC 0."), std::string::npos) << line;
  // Every term carries part of the AUC, and a term with a fifth of the
  // variance (first order) more than one with a twentieth (dense x item).
  for (int k = 0; k < ptrain::datasets::kClicksTerms; ++k) {
    EXPECT_LT(best.auc_without_term[k], best.auc - 0.002) << ptrain::datasets::clicksTermName(k);
    EXPECT_GT(best.auc_without_term[k], 0.6) << ptrain::datasets::clicksTermName(k);
  }
  EXPECT_LT(best.auc_without_term[0], best.auc_without_term[5]);
  const std::string ablation = ptrain::datasets::clicksTermAblationLine(best);
  EXPECT_NE(ablation.find("ground truth without each term (AUC): first order 0."), std::string::npos) << ablation;
  EXPECT_NE(ablation.find(", target attention 0."), std::string::npos) << ablation;

  // Calibration: in each fifth of the samples by probability, the click rate
  // is the mean probability.
  const ClicksExamples e = ds.examples(ClicksSplit::kValidation, 0, 5000);
  std::vector<int64_t> order(5000);
  for (int64_t i = 0; i < 5000; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return e.probabilities[a] < e.probabilities[b]; });
  for (int bin = 0; bin < 5; ++bin) {
    double p = 0, y = 0;
    for (int64_t k = bin * 1000; k < (bin + 1) * 1000; ++k) {
      p += e.probabilities[order[k]];
      y += e.labels[order[k]];
    }
    EXPECT_NEAR(y / 1000, p / 1000, 0.07) << "bin " << bin;
  }
}

// Tables of 1e8 rows: nothing is materialised, ids reach the tail.
// The terms add up to the hidden model's logit, sample by sample.
TEST(ClicksDataset, TermContributionsSumToTheLogit) {
  const ClicksDataset ds(seeded(6));
  const int64_t n = 200;
  const std::vector<double> c = ds.termContributions(ClicksSplit::kValidation, 50, n);
  ASSERT_EQ(c.size(), static_cast<size_t>(n * ptrain::datasets::kClicksTerms));
  double spread = 0;
  for (int64_t i = 0; i < n; ++i) {
    double logit = ds.bias();
    for (int k = 0; k < ptrain::datasets::kClicksTerms; ++k) logit += c[i * ptrain::datasets::kClicksTerms + k];
    EXPECT_NEAR(1 / (1 + std::exp(-logit)), ds.sample(ClicksSplit::kValidation, 50 + i).probability, 1e-12) << i;
    spread += std::abs(c[i * ptrain::datasets::kClicksTerms + 1]);
  }
  EXPECT_GT(spread / n, 0.05);  // the pairwise term is not zero
}

// The fit recovers coefficients chosen here from logits made with them, and
// with noise added explains less of the variance.
TEST(ClicksDataset, TermFitRecoversKnownCoefficients) {
  const ClicksDataset ds(seeded(7));
  constexpr int kTerms = ptrain::datasets::kClicksTerms;
  const int64_t n = 3000;
  const std::vector<double> c = ds.termContributions(ClicksSplit::kValidation, 0, n);
  const double chosen[kTerms] = {1.0, 0.5, 0.0, 2.0, -0.25, 0.75, 0.1};
  std::vector<double> exact(n), noisy(n);
  ptrain::datasets::SplitMix64 rng(11);
  for (int64_t i = 0; i < n; ++i) {
    exact[i] = -1.5;
    for (int k = 0; k < kTerms; ++k) exact[i] += chosen[k] * c[i * kTerms + k];
    noisy[i] = exact[i] + (rng.unit() - 0.5) * 2;
  }
  const auto fit = ptrain::datasets::fitLogitsOnTerms(exact.data(), c, n);
  EXPECT_NEAR(fit.intercept, -1.5, 1e-9);
  for (int k = 0; k < kTerms; ++k) EXPECT_NEAR(fit.coefficient[k], chosen[k], 1e-9) << k;
  EXPECT_NEAR(fit.r2, 1.0, 1e-12);
  const auto rough = ptrain::datasets::fitLogitsOnTerms(noisy.data(), c, n);
  EXPECT_LT(rough.r2, 0.99);
  EXPECT_GT(rough.r2, 0.3);
  for (int k = 0; k < kTerms; ++k) EXPECT_NEAR(rough.coefficient[k], chosen[k], 0.15) << k;
  // Fewer samples than unknowns: one line, not a wrong answer.
  EXPECT_THROW(ptrain::datasets::fitLogitsOnTerms(exact.data(), std::vector<double>(3 * kTerms, 0.0), 3),
               ptrain::ConfigError);
}

TEST(ClicksDataset, HugeTablesCostNothing) {
  const double before = residentMb();
  ClicksOptions o = seeded(4);
  o.table_sizes.assign(kClicksSparseFeatures, 100000000);
  const ClicksDataset ds(o);
  const ClicksExamples e = ds.examples(ClicksSplit::kTrain, 0, 2000);
  const double grown = residentMb() - before;
  // One materialised table of 1e8 rows x 8 floats would be 3200 MB.
  EXPECT_LT(grown, 64.0);
  int64_t largest = 0;
  for (int64_t id : e.sparse) largest = std::max(largest, id);
  for (int64_t id : e.sparse) ASSERT_LT(id, 100000000);
  EXPECT_GT(largest, 10000000);
}

TEST(ClicksDataset, BadOptionsAreConfigErrors) {
  auto message = [](ClicksOptions o) -> std::string {
    try {
      ClicksDataset ds(std::move(o));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no ConfigError)";
  };
  ClicksOptions o = seeded(1);
  o.table_sizes.pop_back();
  EXPECT_NE(message(o).find("table_sizes has 25 entries"), std::string::npos) << message(o);
  o = seeded(1);
  o.table_sizes[7] = 0;
  EXPECT_NE(message(o).find("table_sizes[7]=0 is out of range"), std::string::npos) << message(o);
  o = seeded(1);
  o.item_feature = 0;
  EXPECT_NE(message(o).find("user_feature and item_feature are both feature 0"), std::string::npos) << message(o);
  o = seeded(1);
  o.min_history = 9;
  EXPECT_NE(message(o).find("min_history=9"), std::string::npos) << message(o);
  o = seeded(1);
  o.click_rate = 1.0;
  EXPECT_NE(message(o).find("click_rate=1"), std::string::npos) << message(o);
  EXPECT_TRUE(ptrain::datasets::checkClicksOptions(seeded(1)) == std::nullopt);
}

TEST(ClicksDataset, TableSizes) {
  const std::vector<int64_t> defaults = ptrain::datasets::clicksDefaultTableSizes();
  ASSERT_EQ(static_cast<int64_t>(defaults.size()), kClicksSparseFeatures);
  EXPECT_EQ(*std::max_element(defaults.begin(), defaults.end()), 100000);
  EXPECT_EQ(*std::min_element(defaults.begin(), defaults.end()), 1000);
  using ptrain::datasets::scaleTableSizes;
  EXPECT_EQ(scaleTableSizes({100000000, 100000, 500, 1000}, 0.01, 1000),
            (std::vector<int64_t>{1000000, 1000, 500, 1000}));
  EXPECT_EQ(scaleTableSizes({1000, 3}, 2.5, 1), (std::vector<int64_t>{2500, 8}));
  EXPECT_THROW(scaleTableSizes({10}, 0.0, 1), ConfigError);
  EXPECT_THROW(scaleTableSizes({10}, 1.0, 0), ConfigError);
}

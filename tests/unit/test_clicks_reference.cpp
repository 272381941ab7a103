// The clicks data set's reference learner (datasets/clicks_reference.h):
// its fixed points against the data set's own scores, and that it learns.
#include <gtest/gtest.h>

#include "ptrain/core/error.h"
#include "ptrain/datasets/clicks.h"
#include "ptrain/datasets/clicks_reference.h"

using ptrain::ConfigError;
using ptrain::datasets::ClicksDataset;
using ptrain::datasets::ClicksOptions;
using ptrain::datasets::ClicksReferenceOptions;
using ptrain::datasets::ClicksReferenceResult;
using ptrain::datasets::ClicksReferenceTerms;

namespace {

constexpr int kFirstOrder = 0, kPairwise = 1;  // clicksTermName's order

// 50-row tables (every id seen hundreds of times in 4e5 samples), 4000
// validation samples.
ClicksOptions smallTables() {
  ClicksOptions o;
  o.seed = 7;
  o.validation_size = 4000;
  o.table_sizes = ptrain::datasets::scaleTableSizes(o.table_sizes, 0.002, 50);
  return o;
}

ClicksReferenceOptions budget(int64_t samples) {
  ClicksReferenceOptions r;
  r.samples = samples;
  r.evaluations = 2;
  return r;
}

}  // namespace

// The ground truth and the given terms are scored the way the data set scores
// them (bestValidationScores: its probabilities, and its logit less one term).
TEST(ClicksReference, ScoresTheGroundTruthAndTheGivenTermsAsTheDataSetDoes) {
  const ClicksDataset data(smallTables());
  const auto best = data.bestValidationScores();
  const ClicksReferenceResult r = fitClicksReference(data, budget(512));
  EXPECT_DOUBLE_EQ(r.ground_truth_auc, best.auc);
  // The given terms are summed in float here, in double there: ties may differ.
  EXPECT_NEAR(r.given_auc, best.auc_without_term[kPairwise], 1e-4);
  ASSERT_EQ(r.points.size(), 2u);
  EXPECT_EQ(r.points[0].samples, 256);
  EXPECT_EQ(r.points[1].samples, 512);
}

// With every id seen often, the learner picks up part of the pairwise term
// (its slope on the hidden contribution well above 0) and scores above the
// given terms alone.
TEST(ClicksReference, LearnsPartOfThePairwiseTerm) {
  const ClicksDataset data(smallTables());
  const ClicksReferenceResult r = fitClicksReference(data, budget(400000));
  ASSERT_EQ(r.points.size(), 2u);
  EXPECT_GT(r.points[1].pairwise_coefficient, 0.05);
  EXPECT_GT(r.points[1].auc, r.given_auc);
  EXPECT_LT(r.points[1].auc, r.ground_truth_auc);
}

// Learning the first-order term too starts from the data set's score without
// both terms and recovers most of the first-order term within 2e5 samples.
TEST(ClicksReference, LearnsTheFirstOrderTerm) {
  const ClicksDataset data(smallTables());
  ClicksReferenceOptions o = budget(200000);
  o.terms = ClicksReferenceTerms::kFirstOrderAndPairwise;
  const ClicksReferenceResult r = fitClicksReference(data, o);
  const auto best = data.bestValidationScores();
  EXPECT_LT(r.given_auc, best.auc_without_term[kFirstOrder]);
  EXPECT_GT(r.points.back().auc, best.auc_without_term[kPairwise] - 0.005);
}

// Learning every term starts from nothing given (AUC 0.5: every score ties)
// and within 4e5 samples on small tables comes within a few hundredths of
// the ground truth, above what the given terms alone score when only the
// pairwise term is learned.
TEST(ClicksReference, LearnsEveryTermFromTheSamplesAlone) {
  const ClicksDataset data(smallTables());
  ClicksReferenceOptions o = budget(400000);
  o.terms = ClicksReferenceTerms::kAll;
  const ClicksReferenceResult r = fitClicksReference(data, o);
  EXPECT_DOUBLE_EQ(r.given_auc, 0.5);
  const auto best = data.bestValidationScores();
  EXPECT_GT(r.points.back().auc, best.auc_without_term[kPairwise] - 0.03);
  EXPECT_LT(r.points.back().auc, r.ground_truth_auc);
}

TEST(ClicksReference, RefusesOptionsOutOfRange) {
  const ClicksDataset data(smallTables());
  ClicksReferenceOptions o = budget(100);  // under one batch of 256
  EXPECT_THROW(fitClicksReference(data, o), ConfigError);
  o = budget(1000);
  o.lr = 0;
  EXPECT_THROW(fitClicksReference(data, o), ConfigError);
  o = budget(1000);
  o.dim = 0;
  EXPECT_THROW(fitClicksReference(data, o), ConfigError);
}

// A reference learner for the clicks data set: how much of the hidden model a
// learner of the right form recovers from a given number of training samples.
//
// The ground truth's AUC (ClicksBestScores::auc) is what the hidden model
// itself scores; no learner sees it whole, because it has to learn the
// per-id parameters (26 tables of random vectors and weights) from clicks.
// This learner has the hidden model's own form (clicks.h), so it has no
// modelling gap, only what the samples tell it:
//
//   logit = b + given + sum_t w(id_t)                                  first order
//         + sum_{i<j} r_ij <v(id_i), v(id_j)>                          pairwise, user x item,
//                                                                      interest x category
//         + <A_g, h> + <W2 h, v(item)>,  h = tanh(W1 x + c)            dense, dense x item
//         + a sum_k softmax_k(s_k) s_k,  s_k = t <v(hist_k), v(item)>  target attention
//
// with x the dense log counts standardised on training samples and g the
// item category mod 4, as in the hidden model. What it learns is set by
// ClicksReferenceTerms; `given` is the exact sum of the hidden model's other
// terms (ClicksDataset::termContributions), and learning every term leaves
// nothing given. Trained with Adam on a cosine schedule over `samples`
// training samples, batch by batch in the data set's order, and scored on the
// validation set.
//
// What it says: its AUC after N samples is what a model that knows the
// ground truth's form reaches from N samples, so it bounds what a general
// model (which must also find the form) can expect from as many; with terms
// given, it bounds what learning the rest can add.
#pragma once

#include "ptrain/datasets/clicks.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace ptrain::datasets {

// Which terms the learner learns; the others are given exactly.
enum class ClicksReferenceTerms {
  kPairwise,               // the pairwise term (r, v)
  kFirstOrderAndPairwise,  // and the first-order term (w)
  kAll,                    // every term: nothing is given
};

struct ClicksReferenceOptions {
  int64_t samples = 4'864'000;     // training samples seen, rounded down to whole batches (19000 steps of 256)
  int64_t batch_size = 256;
  int64_t dim = 16;                // width of the learned vectors v
  double lr = 3e-3;                // Adam's peak learning rate; cosine to 0 over the run
  double init_std = 0.1;           // v and r start normal with this deviation
  ClicksReferenceTerms terms = ClicksReferenceTerms::kPairwise;
  int64_t evaluations = 8;         // validation scores, evenly spaced, the last at the end
  uint64_t seed = 0;               // initialisation
};

// The learner after `samples` training samples.
struct ClicksReferencePoint {
  int64_t samples = 0;
  double auc = 0;  // on the validation set
  // Least-squares slope of the learned pairwise part on the hidden model's
  // pairwise contribution over the validation set: 1 = learned at full
  // weight, 0 = nothing of it.
  double pairwise_coefficient = 0;
};

struct ClicksReferenceResult {
  double ground_truth_auc = 0;  // the hidden model's own, on the same validation samples
  double given_auc = 0;         // the given terms alone (what learning adds to); 0.5 when nothing is given
  std::vector<ClicksReferencePoint> points;
};

// Trains and scores the learner on `data` (its options().validation_size
// validation samples). `progress`, if set, sees each point as it is made.
// Throws ConfigError for options out of range.
ClicksReferenceResult fitClicksReference(const ClicksDataset& data, const ClicksReferenceOptions& options,
                                         const std::function<void(const ClicksReferencePoint&)>& progress = {});

}  // namespace ptrain::datasets

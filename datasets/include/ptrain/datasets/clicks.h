// Synthetic click logs in Criteo's shape, with labels drawn from a hidden
// ground-truth model, so the best attainable AUC is known.
//
// A sample (ClicksDataset::sample):
//   - 26 categorical ids, feature t in [0, table_sizes[t]). Rank r (0-based)
//     of a table is drawn with probability (r + 1)^-s / H(n, s), Zipf's law
//     with exponent s = zipf_exponent over n = table_sizes[t] rows, by
//     rejection-inversion (ZipfSampler), so id 0 is the most frequent and a
//     table of 1e8 rows costs no memory. Four features have a role:
//       user_feature      the user, Zipf over its table;
//       item_feature      the target item, Zipf over its table;
//       category_feature  the item's category: a fixed function of the item
//                         (a Zipf draw over the category table from a stream
//                         seeded by hash(world_seed, item)), so every sample
//                         of an item carries the same category;
//       interest_feature  the user's interest: a fixed function of the user,
//                         drawn the same way over the interest table.
//     The other 22 are independent Zipf draws over their tables.
//   - 13 dense counts, Criteo-like: non-negative integers, each feature zero
//     with its own probability (5-45 %) and otherwise floor(exp(mu + sigma Z)),
//     Z standard normal, with per-feature mu in [0, 5) and sigma in [0.5, 1.5)
//     (heavy-tailed, up to ~1e7). Batches carry log(1 + count) as float.
//   - the user's recent items: a history of history_length slots, the first L
//     of them item ids (Zipf over the item table, most recent first), the rest
//     -1; L uniform in [min_history, history_length].
//   - a click label, 1 with probability p = sigmoid(f(x)), and p itself.
//
// The hidden model f (fixed by world_seed and the options, never trained):
//   every (table, id) has an embedding e in R^hidden_dim and a scalar weight w,
//   uniform with unit variance, made on the fly from a hash of (world_seed,
//   table, id), so no table is materialised. f is bias + a weighted sum of
//   seven terms, each centred and scaled to unit variance, with shares of the
//   variance 0.20, 0.20, 0.10, 0.10, 0.15, 0.05, 0.20 in this order (kTermShares):
//     first order       sum_t a_t w(t, id_t)
//     pairwise          sum_{i<j} b_ij <e_i, e_j> / sqrt(d)      (all 325 pairs)
//     user x item       <e_user, e_item> / sqrt(d)
//     interest x cat.   <e_interest, e_category> / sqrt(d)
//     dense             <A_g, tanh(W1 z + c)>, z the standardised log(1 + count),
//                       g = category mod 4: one dense response per category group
//                       (what MoE experts gated by category can pick up)
//     dense x item      <W2 tanh(W1 z + c), e_item> / sqrt(d)
//     target attention  sum_h softmax_h(<e_h, e_item> / sqrt(d)) <e_h, e_item> / sqrt(d)
//                       over the valid history items h (0 without history)
//   The weighted sum is scaled to standard deviation logit_std, and the bias
//   set so the mean click probability is click_rate, both measured on 8192
//   calibration samples drawn from the world seed's own stream.
//
// Determinism: sample `index` of a split comes from a splitmix64 stream seeded
// by hash(seed, split, index), so it is a pure function of (options, split,
// index): the same on every rank, every call, every thread count (no std::
// distributions, no torch generator; libm's exp and log are the only
// platform functions, the same wherever the C library is). Training samples use options.seed;
// validation samples use the fixed kClicksValidationSeed and ignore
// options.seed. The hidden model depends on world_seed and the shape options
// (table sizes, exponent, history, hidden_dim, logit_std, click_rate) but not
// on options.seed, so the validation set (features and labels) is the same for
// every training run with the same world.
//
// Thread-safety: every const method may be called from several threads at once.
//
// Linked statically into the trainers that use it (ptrain_datasets).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/datasets/splitmix.h"

namespace ptrain {
struct Batch;  // ptrain/engine/batch.h; include it to call ClicksDataset::batch
}  // namespace ptrain

namespace ptrain::datasets {

enum class ClicksSplit { kTrain, kValidation };

// "train" / "validation".
const char* clicksSplitName(ClicksSplit split);

inline constexpr int64_t kClicksSparseFeatures = 26;
inline constexpr int64_t kClicksDenseFeatures = 13;
// The seed of every validation sample, whatever options.seed is.
inline constexpr uint64_t kClicksValidationSeed = 0x636C69636B73ULL;  // "clicks"
// The default world: the hidden model's weights.
inline constexpr uint64_t kClicksWorldSeed = 0x776F726C64ULL;  // "world"
// Samples the hidden model is calibrated on (scale and bias).
inline constexpr int64_t kClicksCalibrationSamples = 8192;

// Zipf's law over ranks 0..n-1: P(r) = (r + 1)^-s / H(n, s), s > 0, by
// rejection-inversion (Hoermann and Derflinger 1996, "Rejection-inversion to
// generate variates from monotone discrete distributions", as in Apache
// Commons RNG): O(1) memory and time whatever n, about 1.0x uniform draws
// per sample. Immutable after construction.
class ZipfSampler {
 public:
  // n >= 1, exponent > 0; throws ConfigError otherwise.
  ZipfSampler(int64_t n, double exponent);
  // A rank in [0, n).
  int64_t sample(SplitMix64& rng) const;
  int64_t size() const { return n_; }
  double exponent() const { return exponent_; }

 private:
  double h(double x) const;
  double hIntegral(double x) const;
  double hIntegralInverse(double x) const;

  int64_t n_ = 1;
  double exponent_ = 1;
  double hIntegralX1_ = 0;
  double hIntegralN_ = 0;
  double s_ = 0;
};

// The generalised harmonic number H(n, s) = sum_{k=1..n} k^-s (exact sum;
// O(n)), so rank 0 of a Zipf table has probability 1 / H(n, s).
double zipfHarmonic(int64_t n, double s);

// The 26 table sizes of the small recipe: user 1e5, item 5e4, category 1e3,
// interest 1e3, and the rest between 1e3 and 5e4 rows (3.03e5 in all).
std::vector<int64_t> clicksDefaultTableSizes();

// Each size times `factor`, rounded, but never below min(size, min_rows): a
// table shrinks to at most min_rows rows, and one already smaller stays as it
// is. factor > 0, min_rows >= 1; throws ConfigError otherwise.
std::vector<int64_t> scaleTableSizes(const std::vector<int64_t>& sizes, double factor, int64_t min_rows);

struct ClicksOptions {
  std::vector<int64_t> table_sizes = clicksDefaultTableSizes();  // 26 sizes, each in [1, 2^50]
  double zipf_exponent = 1.1;      // Zipf exponent s of every table, in (0, 10]
  int64_t history_length = 8;      // H, the history slots per sample, in [1, 1024]
  int64_t min_history = 1;         // history items per sample, uniform in [min_history, H]
  int64_t user_feature = 0;        // the roles of four of the 26 features (distinct, in [0, 26))
  int64_t item_feature = 1;
  int64_t category_feature = 2;
  int64_t interest_feature = 3;
  uint64_t seed = 0;                      // training samples only
  uint64_t world_seed = kClicksWorldSeed; // the hidden model, the same for train and validation
  int64_t validation_size = 100000;       // samples in the fixed validation set
  int64_t hidden_dim = 8;                 // embedding width d of the hidden model, in [1, 64]
  double logit_std = 1.2;                 // standard deviation of f(x) before the bias, in [0, 20]
  double click_rate = 0.25;               // mean click probability, in (0, 1)
};

// What is wrong with `options` ("table_sizes has 25 entries; ..."), or nullopt.
std::optional<std::string> checkClicksOptions(const ClicksOptions& options);

struct ClicksSample {
  std::array<int64_t, kClicksSparseFeatures> sparse{};  // ids, feature t in [0, table_sizes[t])
  std::array<int64_t, kClicksDenseFeatures> counts{};   // raw dense counts >= 0
  std::vector<int64_t> history;                         // H slots: item ids, then -1
  int64_t history_length = 0;                           // valid slots, in [min_history, H]
  int64_t item_category = 0;                            // sparse[category_feature]
  int64_t user_interest = 0;                            // sparse[interest_feature]
  double probability = 0;                               // sigmoid(f(x)), the hidden model's click probability
  float label = 0;                                      // 1 (click) or 0
};

// Samples first..first+count-1 of a split, row-major.
struct ClicksExamples {
  int64_t count = 0;
  int64_t history_length = 0;          // H
  std::vector<int64_t> sparse;         // count x 26
  std::vector<float> dense;            // count x 13, log(1 + count)
  std::vector<int64_t> history;        // count x H, -1 past history_lengths
  std::vector<int64_t> history_lengths;// count
  std::vector<float> labels;           // count, 0 or 1
  std::vector<double> probabilities;   // count
};

// The hidden model's seven terms, in the order above.
inline constexpr int kClicksTerms = 7;
// "first order", "pairwise", "user x item", "interest x category", "dense",
// "dense x item", "target attention"; term in [0, kClicksTerms).
const char* clicksTermName(int term);
// The same as metric-name suffixes: "first_order", "pairwise", "user_item",
// "interest_category", "dense", "dense_item", "attention".
const char* clicksTermKey(int term);

// What the ground-truth model scores on the validation set: the best a model
// of the clicks can do there (up to the noise of a finite set).
struct ClicksBestScores {
  int64_t samples = 0;
  double auc = 0;               // rocAuc(probabilities, labels)
  double logloss = 0;           // logLoss(probabilities, labels)
  double expected_logloss = 0;  // mean binary entropy of the probabilities (logloss's expectation)
  double click_rate = 0;        // mean label
  double mean_probability = 0;  // mean probability
  // The AUC of the ground truth's logit with term k left out, against the
  // same labels: what a model that learned everything but that term could
  // reach, so auc - auc_without_term[k] is what the term is worth.
  std::array<double, kClicksTerms> auc_without_term{};
};

// "ground truth on 100000 validation samples: AUC 0.7812, logloss 0.4567
// (expected 0.4561), click rate 0.2503": the line trainers print beside their
// own AUC and logloss.
std::string clicksBestScoresLine(const ClicksBestScores& scores);
// "ground truth without each term: first order 0.7501, pairwise 0.7508, ...":
// auc_without_term, for telling which terms a model's AUC misses.
std::string clicksTermAblationLine(const ClicksBestScores& scores);

// Least squares of logits z_i on [1, c_i0 .. c_i6] (`contributions` as
// ClicksDataset::termContributions lays them out, n rows): coefficient[k] is
// how much of term k the logits carry (1: at the hidden model's weight, 0:
// none; the terms are nearly uncorrelated, so each reads on its own), r2 the
// share of the logits' variance the terms explain. Throws ConfigError when
// the system is singular (fewer samples than terms, or a term that is 0 on
// every sample).
struct ClicksTermFit {
  double intercept = 0;
  std::array<double, kClicksTerms> coefficient{};
  double r2 = 0;
};
ClicksTermFit fitLogitsOnTerms(const double* logits, const std::vector<double>& contributions, int64_t n);

class ClicksDataset {
 public:
  // Checks the options (ConfigError "clicks dataset: <problem>") and builds
  // the hidden model: draws its weights and calibrates it on
  // kClicksCalibrationSamples samples (a few tens of milliseconds).
  explicit ClicksDataset(ClicksOptions options);
  ~ClicksDataset();
  ClicksDataset(const ClicksDataset&) = delete;
  ClicksDataset& operator=(const ClicksDataset&) = delete;

  const ClicksOptions& options() const { return options_; }
  // The hidden model's bias and the scale applied to its centred terms.
  double bias() const;
  double logitScale() const;

  // Sample `index` (>= 0) of `split`; a validation index need not be below
  // validation_size. Throws InternalError for a negative index.
  ClicksSample sample(ClicksSplit split, int64_t index) const;
  // The hidden model's click probability for the features of `sample`
  // (sparse, counts, history, history_length; the other fields are ignored).
  double probability(const ClicksSample& sample) const;
  // Samples first..first+count-1 (first, count >= 0), one thread.
  ClicksExamples examples(ClicksSplit split, int64_t first, int64_t count) const;
  // The same samples as tensors on the cpu, generated over at::parallel_for
  // (the same values whatever the thread count):
  //   "sparse"          [count, 26] int64
  //   "dense"           [count, 13] float32, log(1 + count)
  //   "history"         [count, H] int64, -1 past history_lengths
  //   "history_lengths" [count] int64
  //   "history_mask"    [count, H] float32, 1 on valid slots
  //   "item_categories" [count] int64 (= sparse[:, category_feature])
  //   "user_interests"  [count] int64 (= sparse[:, interest_feature])
  //   "labels"          [count] float32, 0 or 1
  //   "probabilities"   [count] float32
  // Declared with ptrain::Batch incomplete: include ptrain/engine/batch.h to call it.
  Batch batch(ClicksSplit split, int64_t first, int64_t count) const;
  // The ground truth's scores on validation samples 0..validation_size-1
  // (about 6 microseconds a sample, one thread). Throws std::invalid_argument
  // (from rocAuc) when the validation set holds only one class.
  ClicksBestScores bestValidationScores() const;
  // The hidden model's logit of samples first..first+count-1 of `split`,
  // split into its terms: row i holds kClicksTerms values c_k (the centred,
  // weighted and scaled term k), and logit = bias() + sum_k c_k. A model's
  // logits regressed on them say how much of each term it has learned.
  std::vector<double> termContributions(ClicksSplit split, int64_t first, int64_t count) const;

  struct HiddenModel;  // the ground truth's weights (clicks.cpp)

 private:
  // Sample `index` of `split` written into row pointers; probability and
  // label included. `scratch` is reused between calls of one thread.
  void fill(ClicksSplit split, int64_t index, int64_t* sparse, int64_t* counts, int64_t* history,
            int64_t* historyLength, double* probability, float* label, std::vector<double>& scratch) const;
  // The features of the sample whose stream starts at `seed`.
  void drawFeatures(uint64_t seed, int64_t* sparse, int64_t* counts, int64_t* history, int64_t* historyLength) const;
  // The hidden model's raw terms (before centring and scaling) and its logit.
  void computeTerms(const int64_t* sparse, const int64_t* counts, const int64_t* history, int64_t historyLength,
                    double* terms, std::vector<double>& scratch) const;
  double logitOf(const int64_t* sparse, const int64_t* counts, const int64_t* history, int64_t historyLength,
                 std::vector<double>& scratch) const;

  ClicksOptions options_;
  std::vector<ZipfSampler> zipf_;
  std::unique_ptr<HiddenModel> model_;
};

}  // namespace ptrain::datasets

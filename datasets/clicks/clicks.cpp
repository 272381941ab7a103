#include "ptrain/datasets/clicks.h"

#include "ptrain/core/error.h"
#include "ptrain/datasets/auc.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

namespace ptrain::datasets {

using detail::concat;

namespace {

constexpr double kSqrt3 = 1.7320508075688772;
constexpr double kTwoPi = 6.283185307179586;
constexpr int64_t kMaxTableSize = int64_t{1} << 50;  // ranks stay exact in a double
constexpr int64_t kMaxHistory = 1024;
constexpr int64_t kMaxHiddenDim = 64;

// Stream tags mixed into seeds, so no two uses of one seed share a stream.
constexpr uint64_t kTrainStream = 0;
constexpr uint64_t kValidationStream = 1;
constexpr uint64_t kCalibrationStream = 2;
constexpr uint64_t kWorldTag = 0x776F726C64ULL;
constexpr uint64_t kWeightsTag = 1;
constexpr uint64_t kCategoryTag = 2;
constexpr uint64_t kInterestTag = 3;
constexpr uint64_t kTableTag = 16;  // + table index
constexpr uint64_t kLabelTag = 0x6C6162656CULL;

// The hidden model's dense part: 13 -> kDenseHidden (tanh) -> one response
// per category group, and a projection to the embedding width.
constexpr int64_t kDenseHidden = 16;
constexpr int64_t kDenseGroups = 4;
// W1's entries have standard deviation kDenseGain / sqrt(13): inputs are
// standardised, so pre-activations have about this spread and tanh bends.
constexpr double kDenseGain = 1.5;

// The terms of f and their shares of its variance (before correlations).
enum Term { kFirstOrder, kPairwise, kUserItem, kInterestCategory, kDense, kDenseItem, kAttention, kTerms };
constexpr double kTermShares[kTerms] = {0.20, 0.20, 0.10, 0.10, 0.15, 0.05, 0.20};
static_assert(kTerms == kClicksTerms, "clicks.h's kClicksTerms counts the terms of f");
constexpr const char* kTermNames[kTerms] = {"first order", "pairwise",     "user x item",     "interest x category",
                                            "dense",       "dense x item", "target attention"};
constexpr const char* kTermKeys[kTerms] = {"first_order", "pairwise",   "user_item", "interest_category",
                                           "dense",       "dense_item", "attention"};

constexpr int64_t kPairs = kClicksSparseFeatures * (kClicksSparseFeatures - 1) / 2;

// Uniform in [-sqrt 3, sqrt 3): mean 0, variance 1.
double symmetric(SplitMix64& rng) { return (2.0 * rng.unit() - 1.0) * kSqrt3; }

// Standard normal by Box-Muller (one of the pair; the sine is not used).
double normal(SplitMix64& rng) {
  const double u1 = 1.0 - rng.unit();  // (0, 1]
  const double u2 = rng.unit();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// log(1 + x) / x and (exp(x) - 1) / x, continuous at 0 (for s near 1).
double log1pOverX(double x) { return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - x * 0.25)); }
double expm1OverX(double x) {
  return std::abs(x) > 1e-8 ? std::expm1(x) / x : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + x * 0.25));
}

}  // namespace

// ---- ZipfSampler: rejection-inversion ----
//
// h(x) = x^-s is the density, H(x) its integral (up to a constant). A uniform
// u on (H(1.5) - h(1), H(n + 0.5)] is inverted to x = H^-1(u) and rounded to
// k; k is accepted when u lies inside the area h(k) gives it, which holds for
// most draws at once (the test k - x <= s_ short-cuts the common case).

ZipfSampler::ZipfSampler(int64_t n, double exponent) : n_(n), exponent_(exponent) {
  PTRAIN_CHECK_AS(ConfigError, n >= 1, "Zipf table size ", n, " is below 1");
  PTRAIN_CHECK_AS(ConfigError, exponent > 0 && std::isfinite(exponent), "Zipf exponent ", exponent,
                  " is not positive");
  hIntegralX1_ = hIntegral(1.5) - 1.0;
  hIntegralN_ = hIntegral(static_cast<double>(n) + 0.5);
  s_ = 2.0 - hIntegralInverse(hIntegral(2.5) - h(2.0));
}

double ZipfSampler::h(double x) const { return std::exp(-exponent_ * std::log(x)); }

double ZipfSampler::hIntegral(double x) const {
  const double logX = std::log(x);
  return expm1OverX((1.0 - exponent_) * logX) * logX;
}

double ZipfSampler::hIntegralInverse(double x) const {
  // t below -1 only through rounding; log1p needs t >= -1.
  const double t = std::max(-1.0, x * (1.0 - exponent_));
  return std::exp(log1pOverX(t) * x);
}

int64_t ZipfSampler::sample(SplitMix64& rng) const {
  if (n_ == 1) return 0;
  for (;;) {
    const double u = hIntegralN_ + rng.unit() * (hIntegralX1_ - hIntegralN_);
    const double x = hIntegralInverse(u);
    const double kd = std::clamp(std::floor(x + 0.5), 1.0, static_cast<double>(n_));
    if (kd - x <= s_ || u >= hIntegral(kd + 0.5) - h(kd)) return static_cast<int64_t>(kd) - 1;
  }
}

double zipfHarmonic(int64_t n, double s) {
  // Smallest terms first, so the sum loses nothing to the large ones.
  double sum = 0;
  for (int64_t k = n; k >= 1; --k) sum += std::pow(static_cast<double>(k), -s);
  return sum;
}

// ---- options ----

const char* clicksSplitName(ClicksSplit split) { return split == ClicksSplit::kTrain ? "train" : "validation"; }

std::vector<int64_t> clicksDefaultTableSizes() {
  // user, item, category, interest, then 22 Criteo-like tables of mixed sizes.
  return {100000, 50000, 1000, 1000, 20000, 10000, 5000, 2000, 1000, 1000, 50000, 20000, 10000,
          5000,   2000,  1000, 1000, 1000, 10000, 5000, 2000, 1000, 1000, 1000, 1000, 1000};
}

std::vector<int64_t> scaleTableSizes(const std::vector<int64_t>& sizes, double factor, int64_t min_rows) {
  PTRAIN_CHECK_AS(ConfigError, factor > 0 && std::isfinite(factor), "table scale ", factor, " is not positive");
  PTRAIN_CHECK_AS(ConfigError, min_rows >= 1, "table floor ", min_rows, " is below 1 row");
  std::vector<int64_t> scaled;
  scaled.reserve(sizes.size());
  for (int64_t size : sizes) {
    const double rows = std::round(static_cast<double>(size) * factor);
    const int64_t floor = std::min(size, min_rows);
    scaled.push_back(rows >= static_cast<double>(kMaxTableSize) ? kMaxTableSize
                                                                 : std::max(floor, static_cast<int64_t>(rows)));
  }
  return scaled;
}

std::optional<std::string> checkClicksOptions(const ClicksOptions& o) {
  if (static_cast<int64_t>(o.table_sizes.size()) != kClicksSparseFeatures) {
    return concat("table_sizes has ", o.table_sizes.size(), " entries; give one size per categorical feature (",
                  kClicksSparseFeatures, ")");
  }
  for (size_t t = 0; t < o.table_sizes.size(); ++t) {
    if (o.table_sizes[t] < 1 || o.table_sizes[t] > kMaxTableSize) {
      return concat("table_sizes[", t, "]=", o.table_sizes[t], " is out of range: use 1..", kMaxTableSize);
    }
  }
  if (!(o.zipf_exponent > 0 && o.zipf_exponent <= 10)) {
    return concat("zipf_exponent=", o.zipf_exponent, " is out of range: use (0, 10] (Criteo-like: 1.05-1.2)");
  }
  if (o.history_length < 1 || o.history_length > kMaxHistory) {
    return concat("history_length=", o.history_length, " is out of range: use 1..", kMaxHistory);
  }
  if (o.min_history < 0 || o.min_history > o.history_length) {
    return concat("min_history=", o.min_history, " is out of range: use 0..history_length=", o.history_length);
  }
  const int64_t roles[] = {o.user_feature, o.item_feature, o.category_feature, o.interest_feature};
  const char* roleNames[] = {"user_feature", "item_feature", "category_feature", "interest_feature"};
  for (int r = 0; r < 4; ++r) {
    if (roles[r] < 0 || roles[r] >= kClicksSparseFeatures) {
      return concat(roleNames[r], "=", roles[r], " is out of range: use 0..", kClicksSparseFeatures - 1);
    }
    for (int q = 0; q < r; ++q) {
      if (roles[q] == roles[r]) return concat(roleNames[q], " and ", roleNames[r], " are both feature ", roles[r]);
    }
  }
  if (o.validation_size < 0) return concat("validation_size=", o.validation_size, " is negative");
  if (o.hidden_dim < 1 || o.hidden_dim > kMaxHiddenDim) {
    return concat("hidden_dim=", o.hidden_dim, " is out of range: use 1..", kMaxHiddenDim);
  }
  if (!(o.logit_std >= 0 && o.logit_std <= 20)) return concat("logit_std=", o.logit_std, " is out of range: use [0, 20]");
  if (!(o.click_rate > 0 && o.click_rate < 1)) return concat("click_rate=", o.click_rate, " is out of range: use (0, 1)");
  return std::nullopt;
}

const char* clicksTermName(int term) {
  PTRAIN_CHECK(term >= 0 && term < kTerms, "clicks dataset: term ", term, " is outside 0..", kTerms - 1);
  return kTermNames[term];
}

const char* clicksTermKey(int term) {
  PTRAIN_CHECK(term >= 0 && term < kTerms, "clicks dataset: term ", term, " is outside 0..", kTerms - 1);
  return kTermKeys[term];
}

std::string clicksTermAblationLine(const ClicksBestScores& s) {
  std::string line = "ground truth without each term (AUC):";
  char part[64];
  for (int k = 0; k < kTerms; ++k) {
    std::snprintf(part, sizeof part, "%s %s %.4f", k == 0 ? "" : ",", kTermNames[k], s.auc_without_term[k]);
    line += part;
  }
  return line;
}

std::string clicksBestScoresLine(const ClicksBestScores& s) {
  char line[256];
  std::snprintf(line, sizeof line,
                "ground truth on %lld validation samples: AUC %.4f, logloss %.4f (expected %.4f), click rate %.4f",
                static_cast<long long>(s.samples), s.auc, s.logloss, s.expected_logloss, s.click_rate);
  return line;
}

// ---- the hidden model ----

struct ClicksDataset::HiddenModel {
  // Stream roots: samples of each split, per-table embeddings, the category
  // of an item and the interest of a user.
  uint64_t trainHash = 0;
  uint64_t validationHash = 0;
  uint64_t calibrationHash = 0;
  uint64_t categoryHash = 0;
  uint64_t interestHash = 0;
  std::array<uint64_t, kClicksSparseFeatures> tableHash{};

  // How dense counts are drawn: zero with zeroProbability, else floor(exp(mu + sigma Z)).
  std::array<double, kClicksDenseFeatures> zeroProbability{}, mu{}, sigma{};
  // log(1 + count) standardised with these (calibration mean and deviation).
  std::array<double, kClicksDenseFeatures> denseMean{}, denseScale{};

  std::array<double, kClicksSparseFeatures> firstOrder{};  // a_t
  std::array<double, kPairs> pair{};                        // b_ij, i < j, row by row
  std::vector<double> w1, c1;      // [kDenseHidden x 13], [kDenseHidden]
  std::vector<double> groups;      // [kDenseGroups x kDenseHidden]
  std::vector<double> w2;          // [d x kDenseHidden]

  // f = bias + sum_k termWeight[k] (T_k - termMean[k]).
  std::array<double, kTerms> termMean{}, termWeight{};
  double scale = 0;  // logit_std / the deviation of the unscaled sum
  double bias = 0;
};

ClicksDataset::ClicksDataset(ClicksOptions options) : options_(std::move(options)) {
  if (auto problem = checkClicksOptions(options_)) throw ConfigError("clicks dataset: " + *problem);
  zipf_.reserve(kClicksSparseFeatures);
  for (int64_t size : options_.table_sizes) zipf_.emplace_back(size, options_.zipf_exponent);

  auto m = std::make_unique<HiddenModel>();
  m->trainHash = combine(mix64(options_.seed + kSplitMixGolden), kTrainStream);
  m->validationHash = combine(mix64(kClicksValidationSeed + kSplitMixGolden), kValidationStream);
  const uint64_t world = combine(mix64(options_.world_seed + kSplitMixGolden), kWorldTag);
  m->calibrationHash = combine(world, kCalibrationStream);
  m->categoryHash = combine(world, kCategoryTag);
  m->interestHash = combine(world, kInterestTag);
  for (int64_t t = 0; t < kClicksSparseFeatures; ++t) m->tableHash[t] = combine(world, kTableTag + t);

  SplitMix64 rng(combine(world, kWeightsTag));
  for (int64_t j = 0; j < kClicksDenseFeatures; ++j) {
    m->zeroProbability[j] = 0.05 + 0.4 * rng.unit();
    m->mu[j] = 5.0 * rng.unit();
    m->sigma[j] = 0.5 + rng.unit();
  }
  for (double& a : m->firstOrder) a = 0.25 + 0.75 * rng.unit();
  for (double& b : m->pair) b = symmetric(rng);
  const int64_t d = options_.hidden_dim;
  m->w1.resize(kDenseHidden * kClicksDenseFeatures);
  for (double& w : m->w1) w = symmetric(rng) * kDenseGain / std::sqrt(double(kClicksDenseFeatures));
  m->c1.resize(kDenseHidden);
  for (double& c : m->c1) c = 0.5 * symmetric(rng);
  m->groups.resize(kDenseGroups * kDenseHidden);
  for (double& g : m->groups) g = symmetric(rng);
  m->w2.resize(static_cast<size_t>(d * kDenseHidden));
  for (double& w : m->w2) w = symmetric(rng) / std::sqrt(double(kDenseHidden));
  for (int64_t j = 0; j < kClicksDenseFeatures; ++j) m->denseScale[j] = 1;
  model_ = std::move(m);

  // Calibration: draw samples from the world's own stream, standardise the
  // dense inputs on them, then centre and scale every term and the sum, and
  // find the bias that gives the click rate.
  const int64_t n = kClicksCalibrationSamples;
  const int64_t hl = options_.history_length;
  std::vector<int64_t> sparse(static_cast<size_t>(n * kClicksSparseFeatures));
  std::vector<int64_t> counts(static_cast<size_t>(n * kClicksDenseFeatures));
  std::vector<int64_t> history(static_cast<size_t>(n * hl));
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    drawFeatures(combine(model_->calibrationHash, static_cast<uint64_t>(i)), &sparse[i * kClicksSparseFeatures],
                 &counts[i * kClicksDenseFeatures], &history[i * hl], &lengths[i]);
  }
  for (int64_t j = 0; j < kClicksDenseFeatures; ++j) {
    double sum = 0, sumSq = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double x = std::log1p(static_cast<double>(counts[i * kClicksDenseFeatures + j]));
      sum += x;
      sumSq += x * x;
    }
    const double mean = sum / n;
    const double var = std::max(0.0, sumSq / n - mean * mean);
    model_->denseMean[j] = mean;
    model_->denseScale[j] = var > 0 ? 1.0 / std::sqrt(var) : 0.0;
  }
  std::vector<double> terms(static_cast<size_t>(n * kTerms));
  std::vector<double> scratch;
  for (int64_t i = 0; i < n; ++i) {
    computeTerms(&sparse[i * kClicksSparseFeatures], &counts[i * kClicksDenseFeatures], &history[i * hl], lengths[i],
                 &terms[i * kTerms], scratch);
  }
  double shareSum = 0;
  for (double share : kTermShares) shareSum += share;
  for (int k = 0; k < kTerms; ++k) {
    double sum = 0, sumSq = 0;
    for (int64_t i = 0; i < n; ++i) sum += terms[i * kTerms + k];
    const double mean = sum / n;
    for (int64_t i = 0; i < n; ++i) sumSq += (terms[i * kTerms + k] - mean) * (terms[i * kTerms + k] - mean);
    const double deviation = std::sqrt(sumSq / n);
    model_->termMean[k] = mean;
    // A term that does not vary (a table of one row) drops out.
    model_->termWeight[k] = deviation > 1e-12 ? std::sqrt(kTermShares[k] / shareSum) / deviation : 0.0;
  }
  std::vector<double> raw(static_cast<size_t>(n));
  double sum = 0, sumSq = 0;
  for (int64_t i = 0; i < n; ++i) {
    double r = 0;
    for (int k = 0; k < kTerms; ++k) r += model_->termWeight[k] * (terms[i * kTerms + k] - model_->termMean[k]);
    raw[i] = r;
    sum += r;
  }
  for (int64_t i = 0; i < n; ++i) sumSq += (raw[i] - sum / n) * (raw[i] - sum / n);
  const double deviation = std::sqrt(sumSq / n);
  model_->scale = deviation > 1e-12 ? options_.logit_std / deviation : 0.0;
  // The mean probability rises with the bias: bisect on it.
  double lo = -60, hi = 60;
  for (int iteration = 0; iteration < 200; ++iteration) {
    const double mid = 0.5 * (lo + hi);
    double mean = 0;
    for (int64_t i = 0; i < n; ++i) mean += sigmoid(mid + model_->scale * raw[i]);
    (mean / n < options_.click_rate ? lo : hi) = mid;
  }
  model_->bias = 0.5 * (lo + hi);
}

ClicksDataset::~ClicksDataset() = default;

double ClicksDataset::bias() const { return model_->bias; }
double ClicksDataset::logitScale() const { return model_->scale; }

void ClicksDataset::drawFeatures(uint64_t seed, int64_t* sparse, int64_t* counts, int64_t* history,
                                 int64_t* historyLength) const {
  const ClicksOptions& o = options_;
  const HiddenModel& m = *model_;
  SplitMix64 rng(seed);
  for (int64_t t = 0; t < kClicksSparseFeatures; ++t) {
    if (t == o.category_feature || t == o.interest_feature) continue;
    sparse[t] = zipf_[t].sample(rng);
  }
  // An item's category and a user's interest are fixed: drawn from streams
  // seeded by the item and the user alone.
  SplitMix64 categoryRng(combine(m.categoryHash, static_cast<uint64_t>(sparse[o.item_feature])));
  sparse[o.category_feature] = zipf_[o.category_feature].sample(categoryRng);
  SplitMix64 interestRng(combine(m.interestHash, static_cast<uint64_t>(sparse[o.user_feature])));
  sparse[o.interest_feature] = zipf_[o.interest_feature].sample(interestRng);

  for (int64_t j = 0; j < kClicksDenseFeatures; ++j) {
    if (rng.unit() < m.zeroProbability[j]) {
      counts[j] = 0;
    } else {
      counts[j] = static_cast<int64_t>(std::floor(std::exp(m.mu[j] + m.sigma[j] * normal(rng))));
    }
  }

  const int64_t hl = o.history_length;
  const int64_t length = o.min_history + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hl - o.min_history + 1)));
  const ZipfSampler& items = zipf_[o.item_feature];
  for (int64_t h = 0; h < hl; ++h) history[h] = h < length ? items.sample(rng) : -1;
  *historyLength = length;
}

void ClicksDataset::computeTerms(const int64_t* sparse, const int64_t* counts, const int64_t* history,
                                 int64_t historyLength, double* terms, std::vector<double>& scratch) const {
  const ClicksOptions& o = options_;
  const HiddenModel& m = *model_;
  const int64_t d = o.hidden_dim;
  const double invSqrtD = 1.0 / std::sqrt(static_cast<double>(d));
  const int64_t F = kClicksSparseFeatures;
  // Embeddings of the 26 features, then of the history items; then the dense hidden layer.
  scratch.resize(static_cast<size_t>((F + historyLength) * d + kDenseHidden));
  double* emb = scratch.data();
  double* hid = emb + (F + historyLength) * d;

  auto embed = [&](int64_t table, int64_t id, double* out) {
    SplitMix64 r(combine(m.tableHash[table], static_cast<uint64_t>(id)));
    const double w = symmetric(r);
    for (int64_t k = 0; k < d; ++k) out[k] = symmetric(r);
    return w;
  };
  auto dot = [d](const double* a, const double* b) {
    double s = 0;
    for (int64_t k = 0; k < d; ++k) s += a[k] * b[k];
    return s;
  };

  double firstOrder = 0;
  for (int64_t t = 0; t < F; ++t) firstOrder += m.firstOrder[t] * embed(t, sparse[t], emb + t * d);
  terms[kFirstOrder] = firstOrder;

  double pairwise = 0;
  const double* b = m.pair.data();
  for (int64_t i = 0; i < F; ++i) {
    for (int64_t j = i + 1; j < F; ++j) pairwise += *b++ * dot(emb + i * d, emb + j * d);
  }
  terms[kPairwise] = pairwise * invSqrtD;

  const double* item = emb + o.item_feature * d;
  terms[kUserItem] = dot(emb + o.user_feature * d, item) * invSqrtD;
  terms[kInterestCategory] = dot(emb + o.interest_feature * d, emb + o.category_feature * d) * invSqrtD;

  double z[kClicksDenseFeatures];
  for (int64_t j = 0; j < kClicksDenseFeatures; ++j) {
    z[j] = (std::log1p(static_cast<double>(counts[j])) - m.denseMean[j]) * m.denseScale[j];
  }
  for (int64_t u = 0; u < kDenseHidden; ++u) {
    double a = m.c1[u];
    for (int64_t j = 0; j < kClicksDenseFeatures; ++j) a += m.w1[u * kClicksDenseFeatures + j] * z[j];
    hid[u] = std::tanh(a);
  }
  const double* group = m.groups.data() + (sparse[o.category_feature] % kDenseGroups) * kDenseHidden;
  double dense = 0;
  for (int64_t u = 0; u < kDenseHidden; ++u) dense += group[u] * hid[u];
  terms[kDense] = dense;
  double denseItem = 0;
  for (int64_t k = 0; k < d; ++k) {
    double projected = 0;
    for (int64_t u = 0; u < kDenseHidden; ++u) projected += m.w2[k * kDenseHidden + u] * hid[u];
    denseItem += projected * item[k];
  }
  terms[kDenseItem] = denseItem * invSqrtD;

  // Target attention: softmax over the history of each item's affinity with
  // the target, and the attention-weighted affinity.
  double attention = 0;
  if (historyLength > 0) {
    double* hist = emb + F * d;
    double best = -std::numeric_limits<double>::infinity();
    for (int64_t h = 0; h < historyLength; ++h) {
      embed(o.item_feature, history[h], hist + h * d);
      best = std::max(best, dot(hist + h * d, item) * invSqrtD);
    }
    double weightSum = 0, weighted = 0;
    for (int64_t h = 0; h < historyLength; ++h) {
      const double score = dot(hist + h * d, item) * invSqrtD;
      const double w = std::exp(score - best);
      weightSum += w;
      weighted += w * score;
    }
    attention = weighted / weightSum;
  }
  terms[kAttention] = attention;
}

double ClicksDataset::logitOf(const int64_t* sparse, const int64_t* counts, const int64_t* history,
                              int64_t historyLength, std::vector<double>& scratch) const {
  double terms[kTerms];
  computeTerms(sparse, counts, history, historyLength, terms, scratch);
  double raw = 0;
  for (int k = 0; k < kTerms; ++k) raw += model_->termWeight[k] * (terms[k] - model_->termMean[k]);
  return model_->bias + model_->scale * raw;
}

void ClicksDataset::fill(ClicksSplit split, int64_t index, int64_t* sparse, int64_t* counts, int64_t* history,
                         int64_t* historyLength, double* probability, float* label,
                         std::vector<double>& scratch) const {
  PTRAIN_CHECK(index >= 0, "clicks dataset: ", clicksSplitName(split), " sample index ", index, " is negative");
  const uint64_t root = split == ClicksSplit::kTrain ? model_->trainHash : model_->validationHash;
  const uint64_t seed = combine(root, static_cast<uint64_t>(index));
  drawFeatures(seed, sparse, counts, history, historyLength);
  const double p = sigmoid(logitOf(sparse, counts, history, *historyLength, scratch));
  *probability = p;
  // The label from its own stream, so it is one uniform draw against p.
  SplitMix64 labelRng(combine(seed, kLabelTag));
  *label = labelRng.unit() < p ? 1.0f : 0.0f;
}

ClicksSample ClicksDataset::sample(ClicksSplit split, int64_t index) const {
  ClicksSample s;
  s.history.assign(static_cast<size_t>(options_.history_length), -1);
  std::vector<double> scratch;
  fill(split, index, s.sparse.data(), s.counts.data(), s.history.data(), &s.history_length, &s.probability, &s.label,
       scratch);
  s.item_category = s.sparse[static_cast<size_t>(options_.category_feature)];
  s.user_interest = s.sparse[static_cast<size_t>(options_.interest_feature)];
  return s;
}

double ClicksDataset::probability(const ClicksSample& s) const {
  PTRAIN_CHECK(static_cast<int64_t>(s.history.size()) == options_.history_length, "clicks dataset: a sample with ",
               s.history.size(), " history slots, not history_length=", options_.history_length);
  PTRAIN_CHECK(s.history_length >= 0 && s.history_length <= options_.history_length,
               "clicks dataset: history_length ", s.history_length, " is outside 0..", options_.history_length);
  for (int64_t t = 0; t < kClicksSparseFeatures; ++t) {
    PTRAIN_CHECK(s.sparse[t] >= 0 && s.sparse[t] < options_.table_sizes[t], "clicks dataset: id ", s.sparse[t],
                 " of feature ", t, " is outside its table of ", options_.table_sizes[t], " rows");
  }
  std::vector<double> scratch;
  return sigmoid(logitOf(s.sparse.data(), s.counts.data(), s.history.data(), s.history_length, scratch));
}

ClicksExamples ClicksDataset::examples(ClicksSplit split, int64_t first, int64_t count) const {
  PTRAIN_CHECK(first >= 0 && count >= 0, "clicks dataset: samples ", first, "+", count, " are out of range");
  const int64_t hl = options_.history_length;
  ClicksExamples e;
  e.count = count;
  e.history_length = hl;
  e.sparse.resize(static_cast<size_t>(count * kClicksSparseFeatures));
  e.dense.resize(static_cast<size_t>(count * kClicksDenseFeatures));
  e.history.resize(static_cast<size_t>(count * hl));
  e.history_lengths.resize(static_cast<size_t>(count));
  e.labels.resize(static_cast<size_t>(count));
  e.probabilities.resize(static_cast<size_t>(count));
  std::vector<double> scratch;
  int64_t counts[kClicksDenseFeatures];
  for (int64_t r = 0; r < count; ++r) {
    fill(split, first + r, &e.sparse[r * kClicksSparseFeatures], counts, &e.history[r * hl], &e.history_lengths[r],
         &e.probabilities[r], &e.labels[r], scratch);
    for (int64_t j = 0; j < kClicksDenseFeatures; ++j) {
      e.dense[r * kClicksDenseFeatures + j] = static_cast<float>(std::log1p(static_cast<double>(counts[j])));
    }
  }
  return e;
}

ClicksTermFit fitLogitsOnTerms(const double* logits, const std::vector<double>& contributions, int64_t n) {
  constexpr int m = kTerms + 1;  // intercept and the terms
  PTRAIN_CHECK(contributions.size() == static_cast<size_t>(n * kTerms), "clicks term fit: ", contributions.size(),
               " contributions for ", n, " samples of ", kTerms, " terms");
  // Normal equations A b = r, A = X^T X, r = X^T z, in doubles: 8 unknowns.
  double a[m][m] = {}, r[m] = {};
  double meanZ = 0;
  for (int64_t i = 0; i < n; ++i) {
    double x[m];
    x[0] = 1;
    for (int k = 0; k < kTerms; ++k) x[k + 1] = contributions[static_cast<size_t>(i * kTerms + k)];
    for (int p = 0; p < m; ++p) {
      r[p] += x[p] * logits[i];
      for (int q = 0; q < m; ++q) a[p][q] += x[p] * x[q];
    }
    meanZ += logits[i];
  }
  // Gaussian elimination with partial pivoting.
  for (int col = 0; col < m; ++col) {
    int pivot = col;
    for (int row = col + 1; row < m; ++row) {
      if (std::abs(a[row][col]) > std::abs(a[pivot][col])) pivot = row;
    }
    PTRAIN_CHECK_AS(ConfigError, std::abs(a[pivot][col]) > 1e-12 * std::max<double>(1.0, static_cast<double>(n)),
                    "clicks term fit: the terms of ", n, " samples do not determine the fit (term ", col - 1,
                    " is constant or repeats another); score more samples");
    std::swap(a[pivot], a[col]);
    std::swap(r[pivot], r[col]);
    for (int row = col + 1; row < m; ++row) {
      const double f = a[row][col] / a[col][col];
      for (int q = col; q < m; ++q) a[row][q] -= f * a[col][q];
      r[row] -= f * r[col];
    }
  }
  double b[m];
  for (int row = m - 1; row >= 0; --row) {
    double v = r[row];
    for (int q = row + 1; q < m; ++q) v -= a[row][q] * b[q];
    b[row] = v / a[row][row];
  }
  meanZ /= static_cast<double>(n);
  double total = 0, residual = 0;
  for (int64_t i = 0; i < n; ++i) {
    double fitted = b[0];
    for (int k = 0; k < kTerms; ++k) fitted += b[k + 1] * contributions[static_cast<size_t>(i * kTerms + k)];
    total += (logits[i] - meanZ) * (logits[i] - meanZ);
    residual += (logits[i] - fitted) * (logits[i] - fitted);
  }
  ClicksTermFit fit;
  fit.intercept = b[0];
  for (int k = 0; k < kTerms; ++k) fit.coefficient[static_cast<size_t>(k)] = b[k + 1];
  fit.r2 = total > 0 ? 1 - residual / total : 1;
  return fit;
}

std::vector<double> ClicksDataset::termContributions(ClicksSplit split, int64_t first, int64_t count) const {
  PTRAIN_CHECK(first >= 0 && count >= 0, "clicks dataset: samples ", first, "+", count, " are out of range");
  const uint64_t root = split == ClicksSplit::kTrain ? model_->trainHash : model_->validationHash;
  std::vector<int64_t> sparse(kClicksSparseFeatures), counts(kClicksDenseFeatures),
      history(static_cast<size_t>(options_.history_length));
  std::vector<double> scratch, out(static_cast<size_t>(count * kTerms));
  for (int64_t i = 0; i < count; ++i) {
    int64_t length = 0;
    drawFeatures(combine(root, static_cast<uint64_t>(first + i)), sparse.data(), counts.data(), history.data(),
                 &length);
    double terms[kTerms];
    computeTerms(sparse.data(), counts.data(), history.data(), length, terms, scratch);
    for (int k = 0; k < kTerms; ++k) {
      out[static_cast<size_t>(i * kTerms + k)] = model_->scale * model_->termWeight[k] * (terms[k] - model_->termMean[k]);
    }
  }
  return out;
}

ClicksBestScores ClicksDataset::bestValidationScores() const {
  const int64_t n = options_.validation_size;
  std::vector<double> probabilities(static_cast<size_t>(n)), labels(static_cast<size_t>(n));
  std::vector<int64_t> sparse(kClicksSparseFeatures), counts(kClicksDenseFeatures),
      history(static_cast<size_t>(options_.history_length));
  std::vector<double> scratch;
  ClicksBestScores s;
  s.samples = n;
  for (int64_t i = 0; i < n; ++i) {
    int64_t length = 0;
    float label = 0;
    fill(ClicksSplit::kValidation, i, sparse.data(), counts.data(), history.data(), &length, &probabilities[i], &label,
         scratch);
    labels[i] = label;
    const double p = probabilities[i];
    s.click_rate += label;
    s.mean_probability += p;
    if (p > 0 && p < 1) s.expected_logloss -= p * std::log(p) + (1 - p) * std::log1p(-p);
  }
  s.auc = rocAuc(probabilities, labels);
  // The logit less the bias, without term k; AUC depends on the order only.
  const std::vector<double> terms = termContributions(ClicksSplit::kValidation, 0, n);
  std::vector<double> without(static_cast<size_t>(n));
  for (int k = 0; k < kTerms; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      const double* c = &terms[static_cast<size_t>(i * kTerms)];
      double sum = 0;
      for (int j = 0; j < kTerms; ++j) sum += j == k ? 0.0 : c[j];
      without[static_cast<size_t>(i)] = sum;
    }
    s.auc_without_term[k] = rocAuc(without, labels);
  }
  s.logloss = logLoss(probabilities, labels);
  s.expected_logloss /= static_cast<double>(n);
  s.click_rate /= static_cast<double>(n);
  s.mean_probability /= static_cast<double>(n);
  return s;
}

}  // namespace ptrain::datasets

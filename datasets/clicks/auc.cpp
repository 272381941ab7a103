#include "ptrain/datasets/auc.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>

namespace ptrain::datasets {
namespace {

[[noreturn]] void fail(const char* function, const std::string& what) {
  throw std::invalid_argument(std::string(function) + ": " + what);
}

// Throws std::invalid_argument "<function>: <a> scores but <b> labels".
void checkSameSize(const char* function, size_t a, size_t b) {
  if (a != b) {
    throw std::invalid_argument(std::string(function) + ": " + std::to_string(a) + " scores but " +
                                std::to_string(b) + " labels; give one score per label");
  }
}

template <typename T>
std::string text(T value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

// Throws unless every label is 0 or 1; returns the number of 1s.
template <typename T>
int64_t countPositives(const char* function, const T* labels, int64_t n) {
  if (n <= 0) fail(function, "no samples");
  int64_t positives = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] == T(1)) {
      ++positives;
    } else if (labels[i] != T(0)) {
      fail(function, "label " + text(labels[i]) + " at index " + std::to_string(i) + " is not 0 or 1");
    }
  }
  return positives;
}

template <typename T>
double rocAucImpl(const T* scores, const T* labels, int64_t n) {
  const int64_t positives = countPositives("rocAuc", labels, n);
  const int64_t negatives = n - positives;
  if (positives == 0 || negatives == 0) {
    fail("rocAuc", std::string("only one class present in the labels (all ") + (positives == 0 ? "0" : "1") +
                          "); ROC AUC is not defined in that case");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(scores[i])) {
      fail("rocAuc", "score " + text(scores[i]) + " at index " + std::to_string(i) + " is not finite");
    }
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scores[a] < scores[b]; });
  // Twice the Mann-Whitney U, in integers: a group of tied scores holding p
  // positives and q negatives, above `below` negatives, adds 2 p below + p q
  // (each tied positive-negative pair counts one half).
  uint64_t twiceU = 0;
  uint64_t below = 0;
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    uint64_t p = 0, q = 0;
    for (; j < n && scores[order[j]] == scores[order[i]]; ++j) {
      if (labels[order[j]] == T(1)) ++p; else ++q;
    }
    twiceU += 2 * p * below + p * q;
    below += q;
    i = j;
  }
  return static_cast<double>(twiceU) / (2.0 * static_cast<double>(positives) * static_cast<double>(negatives));
}

template <typename T>
double logLossImpl(const T* probabilities, const T* labels, int64_t n) {
  countPositives("logLoss", labels, n);
  // scikit-learn clips at the epsilon of y_pred's dtype; in that dtype, so
  // 1 - eps is the largest value below 1 that float (or double) holds.
  const T eps = std::numeric_limits<T>::epsilon();
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T raw = probabilities[i];
    if (!(raw >= T(0) && raw <= T(1))) {
      fail("logLoss", "probability " + text(raw) + " at index " + std::to_string(i) + " is outside [0, 1]");
    }
    const double p = static_cast<double>(std::clamp(raw, eps, T(1) - eps));
    sum -= labels[i] == T(1) ? std::log(p) : std::log1p(-p);
  }
  return sum / static_cast<double>(n);
}

}  // namespace

double rocAuc(const double* scores, const double* labels, int64_t n) { return rocAucImpl(scores, labels, n); }
double rocAuc(const float* scores, const float* labels, int64_t n) { return rocAucImpl(scores, labels, n); }
double logLoss(const double* probabilities, const double* labels, int64_t n) {
  return logLossImpl(probabilities, labels, n);
}
double logLoss(const float* probabilities, const float* labels, int64_t n) {
  return logLossImpl(probabilities, labels, n);
}


double rocAuc(const std::vector<double>& scores, const std::vector<double>& labels) {
  checkSameSize("rocAuc", scores.size(), labels.size());
  return rocAuc(scores.data(), labels.data(), static_cast<int64_t>(scores.size()));
}
double rocAuc(const std::vector<float>& scores, const std::vector<float>& labels) {
  checkSameSize("rocAuc", scores.size(), labels.size());
  return rocAuc(scores.data(), labels.data(), static_cast<int64_t>(scores.size()));
}
double logLoss(const std::vector<double>& probabilities, const std::vector<double>& labels) {
  checkSameSize("logLoss", probabilities.size(), labels.size());
  return logLoss(probabilities.data(), labels.data(), static_cast<int64_t>(probabilities.size()));
}
double logLoss(const std::vector<float>& probabilities, const std::vector<float>& labels) {
  checkSameSize("logLoss", probabilities.size(), labels.size());
  return logLoss(probabilities.data(), labels.data(), static_cast<int64_t>(probabilities.size()));
}

}  // namespace ptrain::datasets

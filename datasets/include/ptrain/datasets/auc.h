// Binary classification metrics computed as scikit-learn computes them, for
// click-through models (the recommender trainer, the clicks data set's
// ground truth).
//
// rocAuc is scikit-learn's roc_auc_score for binary labels: the area under
// the ROC curve, with tied scores averaged (the curve moves diagonally
// through a group of equal scores), which equals the Mann-Whitney statistic
// with midranks: U / (P N), U = sum over positive-negative pairs of
// [s_pos > s_neg] + 0.5 [s_pos == s_neg]. It is counted exactly in integers
// (one sort, O(n log n)); only the final division rounds.
//
// logLoss is scikit-learn's log_loss for binary labels and 1-D probabilities
// of the positive class: the mean of -(y log p + (1 - y) log(1 - p)), with p
// clipped to [eps, 1 - eps] where eps is the machine epsilon of the input's
// type (2.2e-16 for double, 1.2e-7 for float), as scikit-learn >= 1.5 does
// (np.finfo(y_pred.dtype).eps; older versions clipped at 1e-15). Unlike
// scikit-learn it accepts labels of one class only (the loss is defined).
//
// Both throw std::invalid_argument with the function's name and the fault:
// sizes that differ, no samples, a label other than 0 or 1, a score that is
// NaN or infinite (scikit-learn rejects them too), a probability outside
// [0, 1], and for rocAuc labels of one class only ("only one class present
// in the labels (all 1); ROC AUC is not defined in that case", scikit-learn's
// ValueError). Pure functions: any thread, no state.
#pragma once

#include <cstdint>
#include <vector>

namespace ptrain::datasets {

double rocAuc(const double* scores, const double* labels, int64_t n);
double rocAuc(const float* scores, const float* labels, int64_t n);
double logLoss(const double* probabilities, const double* labels, int64_t n);
double logLoss(const float* probabilities, const float* labels, int64_t n);

// The same over vectors, whose sizes must match.
double rocAuc(const std::vector<double>& scores, const std::vector<double>& labels);
double rocAuc(const std::vector<float>& scores, const std::vector<float>& labels);
double logLoss(const std::vector<double>& probabilities, const std::vector<double>& labels);
double logLoss(const std::vector<float>& probabilities, const std::vector<float>& labels);

}  // namespace ptrain::datasets

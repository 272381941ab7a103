// The row updates of the sparse optimizers (engine/optimizer.h,
// OptimizerOptions::sparse_name) on a table [rows, dim] with a dense
// gradient: only the rows whose gradient row is not all zero are read and
// written; the others, and their state, are left untouched.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "ptrain/engine/row_sparse.h"

namespace ptrain::detail {

// FBGEMM's exact row-wise Adagrad on the touched rows i, with g = grad_i *
// gradScale + weightDecay * p_i: rowSum_i += mean(g^2);
// p_i -= lr * g / (sqrt(rowSum_i) + eps). rowSum: [rows].
void rowwiseAdagradRows(at::Tensor& param, const at::Tensor& grad, at::Tensor& rowSum, double lr, double eps,
                        double weightDecay, double gradScale);

// torch.optim.SparseAdam on the touched rows (g = grad_i * gradScale), after a
// decoupled decay p_i *= 1 - lr * weightDecay: m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p_i -= lr * sqrt(1-b2^t) / (1-b1^t) * m / (sqrt(v) + eps),
// t = count. m, v: shaped like param.
void sparseAdamRows(at::Tensor& param, const at::Tensor& grad, at::Tensor& m, at::Tensor& v, double lr, double beta1,
                    double beta2, double eps, double weightDecay, double gradScale, int64_t count);

}  // namespace ptrain::detail

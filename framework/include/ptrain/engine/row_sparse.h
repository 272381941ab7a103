// Row-sparse gradients: a table [rows, dim] whose step reads only some rows
// (an embedding lookup) gets a gradient that is zero everywhere else.
// ParameterPlacement::row_sparse_gradient marks such a parameter; the sparse
// optimizers update only these rows and data parallelism exchanges only them.
#pragma once

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain {

// Rows of `grad` [rows, dim] with a value other than zero (NaN included),
// ascending (int64, on grad's device). One pass over a contiguous float32 host
// gradient with no temporary of its size; any other gradient through
// ne(0).any(1).
PTRAIN_API at::Tensor touchedRows(const at::Tensor& grad);

}  // namespace ptrain

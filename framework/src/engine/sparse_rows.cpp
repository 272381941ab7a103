#include "sparse_rows.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace ptrain {

at::Tensor touchedRows(const at::Tensor& grad) {
  if (!(grad.is_cpu() && grad.scalar_type() == at::kFloat && grad.is_contiguous() && grad.dim() == 2)) {
    return grad.ne(0).any(1).nonzero().squeeze(1);
  }
  // The host's float32 tables: one pass over the gradient with no temporary
  // of its size (the generic expression above makes two), the rows in order.
  const int64_t rows = grad.size(0), dim = grad.size(1);
  // The bits, shifted past the sign: zero exactly for +0 and -0, so NaN
  // counts as ne(0) counts it. An OR of integers vectorizes where a chain
  // of float compares does not.
  const uint32_t* g = reinterpret_cast<const uint32_t*>(grad.data_ptr<float>());
  std::vector<uint8_t> touched(static_cast<size_t>(rows));
  at::parallel_for(0, rows, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint32_t* row = g + r * dim;
      uint32_t bits = 0;
      for (int64_t c = 0; c < dim; ++c) bits |= row[c] << 1;
      touched[static_cast<size_t>(r)] = bits != 0;
    }
  });
  std::vector<int64_t> index;
  for (int64_t r = 0; r < rows; ++r)
    if (touched[static_cast<size_t>(r)]) index.push_back(r);
  return torch::tensor(index, torch::kInt64);
}

namespace detail {

void rowwiseAdagradRows(at::Tensor& param, const at::Tensor& grad, at::Tensor& rowSum, double lr, double eps,
                        double weightDecay, double gradScale) {
  const at::Tensor rows = touchedRows(grad);
  if (rows.numel() == 0) return;
  // Gathered, updated, scattered back: the cost follows the touched rows
  // (plus one pass over the gradient to find them).
  at::Tensor g = grad.index_select(0, rows);
  if (gradScale != 1.0) g = g * gradScale;
  at::Tensor p = param.index_select(0, rows);
  if (weightDecay > 0) g = g + p * weightDecay;
  at::Tensor sum = rowSum.index_select(0, rows) + g.square().mean(1);
  rowSum.index_copy_(0, rows, sum);
  p.addcdiv_(g, (sum.sqrt() + eps).unsqueeze(1), -lr);
  param.index_copy_(0, rows, p);
}

void sparseAdamRows(at::Tensor& param, const at::Tensor& grad, at::Tensor& m, at::Tensor& v, double lr, double beta1,
                    double beta2, double eps, double weightDecay, double gradScale, int64_t count) {
  const at::Tensor rows = touchedRows(grad);
  if (rows.numel() == 0) return;
  at::Tensor g = grad.index_select(0, rows);
  if (gradScale != 1.0) g = g * gradScale;
  at::Tensor p = param.index_select(0, rows);
  if (weightDecay > 0) p.mul_(1.0 - lr * weightDecay);
  at::Tensor mr = m.index_select(0, rows).mul_(beta1).add_(g, 1.0 - beta1);
  at::Tensor vr = v.index_select(0, rows).mul_(beta2).addcmul_(g, g, 1.0 - beta2);
  m.index_copy_(0, rows, mr);
  v.index_copy_(0, rows, vr);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(count));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(count));
  p.addcdiv_(mr, vr.sqrt().add_(eps), -lr * std::sqrt(bc2) / bc1);
  param.index_copy_(0, rows, p);
}

}  // namespace detail
}  // namespace ptrain

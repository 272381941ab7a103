#include "adamw_kernel.h"

#include <ATen/Parallel.h>

#include <cmath>

namespace ptrain::detail {
namespace {

// The same arithmetic, in the same order, as the foreach path of
// Optimizer::step: decay, moments, denominator, update. Written as a plain
// loop over restrict pointers so the compiler vectorises it (this file is
// built with -fno-math-errno, which lets sqrt become a vector instruction).
void adamwRange(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                int64_t begin, int64_t end, const AdamwStep s) {
  const float oneMinusBeta1 = 1.0f - s.beta1;
  const float oneMinusBeta2 = 1.0f - s.beta2;
  for (int64_t i = begin; i < end; ++i) {
    const float grad = g[i] * s.grad_scale;
    const float mi = m[i] * s.beta1 + oneMinusBeta1 * grad;
    const float vi = v[i] * s.beta2 + oneMinusBeta2 * grad * grad;
    const float denom = std::sqrt(vi) * s.inv_sqrt_bias_correction2 + s.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * s.decay_factor - s.step_size * (mi / denom);
  }
}

}  // namespace

void adamwUpdate(float* p, const float* g, float* m, float* v, int64_t n, const AdamwStep& s) {
  // 32k floats (128 KiB per array) per task: large enough that waking a
  // thread pays off, small enough to split a 256x256 matrix over two cores.
  constexpr int64_t kGrain = 32768;
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) { adamwRange(p, g, m, v, begin, end, s); });
}

}  // namespace ptrain::detail

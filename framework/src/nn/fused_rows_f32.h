#pragma once
// Float32 row loops of the host fused kernels that are bound by `exp` (bias
// GELU). They live in their own translation unit, free of libtorch, so that
// each is compiled twice, for the baseline x86-64 and for AVX2+FMA, and picked
// at load time by the CPU it runs on (GCC's target_clones). Their `exp` is a
// polynomial the compiler vectorises, where std::exp would stay scalar.

#include <cstdint>

namespace ptrain::nn::detail {

// y[j] = gelu_tanh(x[j] + bias[j]) for j < width; bias may be null.
void biasGeluRowF32(const float* x, const float* bias, float* y, int64_t width);

// dx[j] = dy[j] * gelu_tanh'(x[j] + bias[j]); adds dx[j] into biasGradPartial[j]
// when that is not null.
void biasGeluBackwardRowF32(const float* dy, const float* x, const float* bias, float* dx, float* biasGradPartial,
                            int64_t width);

}  // namespace ptrain::nn::detail

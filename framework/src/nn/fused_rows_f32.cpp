#include "fused_rows_f32.h"

#include <cmath>
#include <cstring>

// Two clones (baseline, AVX2+FMA) chosen at load time, where GCC supports it
// on x86-64; elsewhere one build for the target the compiler was given.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define PTRAIN_ISA_CLONES __attribute__((target_clones("avx2,fma", "default")))
#else
#define PTRAIN_ISA_CLONES
#endif

namespace ptrain::nn::detail {
namespace {

inline float bitsToFloat(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// exp(x) for x <= 0 (GELU needs exp(-2|z|) only), written so that a loop of
// it vectorises: exp(x) = 2^k exp(r), k = round(x / ln 2) by truncation (x is
// never positive), r = x - k ln 2 in two parts (Cody-Waite), exp(r) by the
// Cephes minimax polynomial on [-ln2/2, ln2/2] (relative error about 1e-7),
// 2^k by building the float's exponent. Below -87 (exp underflows float's
// normal range) the result is 0 or a normal number as tiny; GELU's callers
// only add it to 1.
inline float expNonPositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float k = static_cast<float>(static_cast<int32_t>(x * 1.44269504088896341f - 0.5f));
  const float r = (x - k * 0.693359375f) + k * 2.12194440e-4f;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r2 + r + 1.0f;
  return er * bitsToFloat((static_cast<int32_t>(k) + 127) << 23);
}

constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

// GELU, tanh form: 0.5 u (1 + tanh(z)), z = beta (u + kappa u^3), with
// tanh(|z|) = (1 - e) / (1 + e), e = exp(-2|z|). The bias is a template
// argument so the loop has no branch (a branch keeps it from vectorising).
template <bool kHasBias>
inline void biasGeluRow(const float* x, const float* bias, float* y, int64_t width) {
#pragma omp simd
  for (int64_t j = 0; j < width; ++j) {
    const float u = kHasBias ? x[j] + bias[j] : x[j];
    const float z = kBeta * (u + kKappa * u * u * u);
    const float e = expNonPositive(-2.0f * std::fabs(z));
    const float t = std::copysign((1.0f - e) / (1.0f + e), z);
    y[j] = 0.5f * u * (1.0f + t);
  }
}

// gelu' = 0.5 (1 + tanh z) + 0.5 u sech^2(z) beta (1 + 3 kappa u^2), with
// sech^2 z = 4e / (1 + e)^2: no cancellation where tanh is near +-1.
template <bool kHasBias>
inline void biasGeluBackwardRow(const float* dy, const float* x, const float* bias, float* dx, int64_t width) {
#pragma omp simd
  for (int64_t j = 0; j < width; ++j) {
    const float u = kHasBias ? x[j] + bias[j] : x[j];
    const float z = kBeta * (u + kKappa * u * u * u);
    const float e = expNonPositive(-2.0f * std::fabs(z));
    const float d = 1.0f + e;
    const float t = std::copysign((1.0f - e) / d, z);
    const float sech2 = 4.0f * e / (d * d);
    dx[j] = dy[j] * (0.5f * (1.0f + t) + 0.5f * u * sech2 * kBeta * (1.0f + 3.0f * kKappa * u * u));
  }
}

}  // namespace

PTRAIN_ISA_CLONES
void biasGeluRowF32(const float* x, const float* bias, float* y, int64_t width) {
  if (bias != nullptr) {
    biasGeluRow<true>(x, bias, y, width);
  } else {
    biasGeluRow<false>(x, bias, y, width);
  }
}

PTRAIN_ISA_CLONES
void biasGeluBackwardRowF32(const float* dy, const float* x, const float* bias, float* dx, float* biasGradPartial,
                            int64_t width) {
  if (bias != nullptr) {
    biasGeluBackwardRow<true>(dy, x, bias, dx, width);
  } else {
    biasGeluBackwardRow<false>(dy, x, bias, dx, width);
  }
  if (biasGradPartial != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) biasGradPartial[j] += dx[j];
  }
}

}  // namespace ptrain::nn::detail

// AdamW in one pass on a CUDA device: the same arithmetic as the host kernel
// (adamw_kernel.cpp), each element of p, g, m and v read once and written
// once. Four floats per thread and step where the four arrays allow 16-byte
// loads, which is what a memory-bound update needs to reach the card's
// bandwidth; a grid-stride loop covers the rest.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "adamw_kernel.h"

namespace ptrain::detail {
namespace {

__device__ __forceinline__ void adamwOne(float& p, float g, float& m, float& v, const AdamwStep& s) {
  const float grad = g * s.grad_scale;
  const float mi = m * s.beta1 + (1.0f - s.beta1) * grad;
  const float vi = v * s.beta2 + (1.0f - s.beta2) * grad * grad;
  const float denom = sqrtf(vi) * s.inv_sqrt_bias_correction2 + s.eps;
  m = mi;
  v = vi;
  p = p * s.decay_factor - s.step_size * (mi / denom);
}

__global__ void adamwVec4(float4* __restrict__ p, const float4* __restrict__ g, float4* __restrict__ m,
                          float4* __restrict__ v, int64_t n4, AdamwStep s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float4 pi = p[i], mi = m[i], vi = v[i];
    const float4 gi = g[i];
    adamwOne(pi.x, gi.x, mi.x, vi.x, s);
    adamwOne(pi.y, gi.y, mi.y, vi.y, s);
    adamwOne(pi.z, gi.z, mi.z, vi.z, s);
    adamwOne(pi.w, gi.w, mi.w, vi.w, s);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void adamwScalar(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, int64_t begin, int64_t n, AdamwStep s) {
  for (int64_t i = begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    adamwOne(p[i], g[i], m[i], v[i], s);
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

int blocksFor(int64_t work, int threads) {
  // Enough blocks to fill any current card several times over; the
  // grid-stride loops take the rest.
  const int64_t blocks = (work + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("adamw CUDA kernel: ") + what + ": " + cudaGetErrorString(status));
  }
}

}  // namespace

void adamwUpdateCuda(float* p, const float* g, float* m, float* v, int64_t n, const AdamwStep& s, void* stream) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  auto cudaStream = static_cast<cudaStream_t>(stream);
  int64_t done = 0;
  if (aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v)) {
    const int64_t n4 = n / 4;
    if (n4 > 0) {
      adamwVec4<<<blocksFor(n4, kThreads), kThreads, 0, cudaStream>>>(
          reinterpret_cast<float4*>(p), reinterpret_cast<const float4*>(g), reinterpret_cast<float4*>(m),
          reinterpret_cast<float4*>(v), n4, s);
      check(cudaGetLastError(), "launch");
    }
    done = n4 * 4;
  }
  if (done < n) {
    adamwScalar<<<blocksFor(n - done, kThreads), kThreads, 0, cudaStream>>>(p, g, m, v, done, n, s);
    check(cudaGetLastError(), "launch");
  }
}

}  // namespace ptrain::detail

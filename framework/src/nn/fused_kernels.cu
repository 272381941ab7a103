// The fused kernels of nn/fused.h on a CUDA device: one block per row for the
// row-wise ones (softmax, LayerNorm), reduced with warp shuffles; grid-stride
// loops for the elementwise ones; one thread per column for the sums over
// rows of the parameter gradients. float32 arithmetic for every storage dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fused_kernels_cuda.h"

namespace ptrain::nn::detail {
namespace {

constexpr int kThreads = 256;
constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;

template <typename T>
__device__ __forceinline__ float load(const T* p, int64_t i);
template <>
__device__ __forceinline__ float load<float>(const float* p, int64_t i) { return p[i]; }
template <>
__device__ __forceinline__ float load<__half>(const __half* p, int64_t i) { return __half2float(p[i]); }
template <>
__device__ __forceinline__ float load<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

template <typename T>
__device__ __forceinline__ void store(T* p, int64_t i, float v);
template <>
__device__ __forceinline__ void store<float>(float* p, int64_t i, float v) { p[i] = v; }
template <>
__device__ __forceinline__ void store<__half>(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
template <>
__device__ __forceinline__ void store<__nv_bfloat16>(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

// The value as the storage dtype rounds it.
template <typename T>
__device__ __forceinline__ float rounded(float v) {
  T t;
  store<T>(&t, 0, v);
  return load<T>(&t, 0);
}

__device__ __forceinline__ float warpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The sum (or max) of `v` over the block; every thread gets it.
template <bool kMax>
__device__ float blockReduce(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = kMax ? warpMax(v) : warpSum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  const float identity = kMax ? -INFINITY : 0.0f;
  v = threadIdx.x < warps ? partial[threadIdx.x] : identity;
  if (warp == 0) v = kMax ? warpMax(v) : warpSum(v);
  if (threadIdx.x == 0) partial[0] = v;
  __syncthreads();
  const float result = partial[0];
  __syncthreads();  // `partial` is reused by the next call
  return result;
}

template <typename T>
__global__ void maskedSoftmaxKernel(const T* x, const float* mask, T* y, int64_t queries, int64_t width,
                                    float scale) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * width;
  const float* m = mask != nullptr ? mask + (static_cast<int64_t>(blockIdx.x) % queries) * width : nullptr;
  float largest = -INFINITY;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    largest = fmaxf(largest, scale * load(x, base + j) + (m != nullptr ? m[j] : 0.0f));
  }
  largest = blockReduce<true>(largest);
  if (largest == -INFINITY) {  // every entry masked
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) store(y, base + j, 0.0f);
    return;
  }
  float sum = 0;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    sum += expf(scale * load(x, base + j) + (m != nullptr ? m[j] : 0.0f) - largest);
  }
  const float inv = 1.0f / blockReduce<false>(sum);
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    store(y, base + j, expf(scale * load(x, base + j) + (m != nullptr ? m[j] : 0.0f) - largest) * inv);
  }
}

template <typename T>
__global__ void maskedSoftmaxBackwardKernel(const T* dy, const T* y, T* dx, int64_t width, float scale) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * width;
  float dot = 0;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) dot += load(dy, base + j) * load(y, base + j);
  dot = blockReduce<false>(dot);
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    store(dx, base + j, scale * load(y, base + j) * (load(dy, base + j) - dot));
  }
}

#define PTRAIN_GRID_STRIDE(i, n)                                                                  \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void biasGeluKernel(const T* x, const T* bias, T* y, int64_t n, int64_t width) {
  PTRAIN_GRID_STRIDE(i, n) {
    const float u = load(x, i) + (bias != nullptr ? load(bias, i % width) : 0.0f);
    const float t = tanhf(kGeluBeta * (u + kGeluKappa * u * u * u));
    store(y, i, 0.5f * u * (1.0f + t));
  }
}

template <typename T>
__global__ void biasGeluBackwardKernel(const T* dy, const T* x, const T* bias, T* dx, int64_t n, int64_t width) {
  PTRAIN_GRID_STRIDE(i, n) {
    const float u = load(x, i) + (bias != nullptr ? load(bias, i % width) : 0.0f);
    const float t = tanhf(kGeluBeta * (u + kGeluKappa * u * u * u));
    const float slope = 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * kGeluBeta * (1.0f + 3.0f * kGeluKappa * u * u);
    store(dx, i, load(dy, i) * slope);
  }
}

template <typename T>
__global__ void biasDropoutAddKernel(const T* x, const T* bias, const T* residual, const T* noise, T* out, int64_t n,
                                     int64_t width) {
  PTRAIN_GRID_STRIDE(i, n) {
    float v = rounded<T>(load(x, i) + (bias != nullptr ? load(bias, i % width) : 0.0f));
    if (noise != nullptr) v = rounded<T>(v * load(noise, i));
    store(out, i, load(residual, i) + v);
  }
}

template <typename T>
__global__ void multiplyKernel(const T* a, const T* b, T* out, int64_t n) {
  PTRAIN_GRID_STRIDE(i, n) { store(out, i, load(a, i) * load(b, i)); }
}

template <typename T>
__global__ void columnSumKernel(const T* a, T* out, int64_t rows, int64_t width) {
  PTRAIN_GRID_STRIDE(j, width) {
    float total = 0;
    for (int64_t r = 0; r < rows; ++r) total += load(a, r * width + j);
    store(out, j, total);
  }
}

template <typename T>
__global__ void addLayerNormKernel(const T* x, const T* residual, const T* weight, const T* bias, T* y, T* sum,
                                   float* mean, float* rstd, int64_t width, float eps) {
  const int64_t row = blockIdx.x, base = row * width;
  auto value = [&](int64_t j) {
    return residual != nullptr ? rounded<T>(load(x, base + j) + load(residual, base + j)) : load(x, base + j);
  };
  float total = 0;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    const float v = value(j);
    if (residual != nullptr) store(sum, base + j, v);
    total += v;
  }
  const float mu = blockReduce<false>(total) / static_cast<float>(width);
  float var = 0;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    const float d = value(j) - mu;
    var += d * d;
  }
  const float inv = rsqrtf(blockReduce<false>(var) / static_cast<float>(width) + eps);
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = inv;
  }
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    store(y, base + j, (value(j) - mu) * inv * load(weight, j) + load(bias, j));
  }
}

template <typename T>
__global__ void addLayerNormBackwardKernel(const T* dy, const T* dsum, const T* s, const T* weight, const float* mean,
                                           const float* rstd, T* ds, int64_t width) {
  const int64_t row = blockIdx.x, base = row * width;
  const float mu = mean[row], inv = rstd[row];
  float g = 0, gx = 0;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    const float gj = load(dy, base + j) * load(weight, j);
    g += gj;
    gx += gj * (load(s, base + j) - mu) * inv;
  }
  const float meanG = blockReduce<false>(g) / static_cast<float>(width);
  const float meanGX = blockReduce<false>(gx) / static_cast<float>(width);
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    const float xhat = (load(s, base + j) - mu) * inv;
    float v = inv * (load(dy, base + j) * load(weight, j) - meanG - xhat * meanGX);
    if (dsum != nullptr) v += load(dsum, base + j);
    store(ds, base + j, v);
  }
}

template <typename T>
__global__ void layerNormParamGradKernel(const T* dy, const T* s, const float* mean, const float* rstd,
                                         float* dweight, float* dbias, int64_t rows, int64_t width) {
  PTRAIN_GRID_STRIDE(j, width) {
    float w = 0, b = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float d = load(dy, r * width + j);
      w += d * (load(s, r * width + j) - mean[r]) * rstd[r];
      b += d;
    }
    dweight[j] = w;
    dbias[j] = b;
  }
}

int gridFor(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

// One block per row: the grid's x dimension holds 2^31 - 1 blocks.
unsigned rowGrid(int64_t rows) {
  if (rows > 2147483647LL) throw std::runtime_error("fused CUDA kernel: more than 2^31 - 1 rows");
  return static_cast<unsigned>(rows);
}

void check(const char* what) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("fused CUDA kernel ") + what + ": " + cudaGetErrorString(status));
  }
}

// Calls f(T{}) with T the storage type of `t`.
template <typename F>
void dispatch(CudaDtype t, const F& f) {
  switch (t) {
    case CudaDtype::kFloat: f(float{}); break;
    case CudaDtype::kHalf: f(__half{}); break;
    case CudaDtype::kBFloat16: f(__nv_bfloat16{}); break;
  }
}

template <typename T>
const T* as(const void* p) {
  return static_cast<const T*>(p);
}
template <typename T>
T* as(void* p) {
  return static_cast<T*>(p);
}

}  // namespace

void maskedSoftmaxCuda(CudaDtype t, const void* x, const float* mask, void* y, int64_t rows, int64_t queries,
                       int64_t width, float scale, void* stream) {
  if (rows == 0) return;
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    maskedSoftmaxKernel<T><<<rowGrid(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        as<T>(x), mask, as<T>(y), queries, width, scale);
  });
  check("masked softmax");
}

void maskedSoftmaxBackwardCuda(CudaDtype t, const void* dy, const void* y, void* dx, int64_t rows, int64_t width,
                               float scale, void* stream) {
  if (rows == 0) return;
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    maskedSoftmaxBackwardKernel<T><<<rowGrid(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        as<T>(dy), as<T>(y), as<T>(dx), width, scale);
  });
  check("masked softmax backward");
}

void biasGeluCuda(CudaDtype t, const void* x, const void* bias, void* y, int64_t rows, int64_t width, void* stream) {
  const int64_t n = rows * width;
  if (n == 0) return;
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    biasGeluKernel<T><<<gridFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(as<T>(x), as<T>(bias),
                                                                                         as<T>(y), n, width);
  });
  check("bias gelu");
}

void biasGeluBackwardCuda(CudaDtype t, const void* dy, const void* x, const void* bias, void* dx, int64_t rows,
                          int64_t width, void* stream) {
  const int64_t n = rows * width;
  if (n == 0) return;
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    biasGeluBackwardKernel<T><<<gridFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        as<T>(dy), as<T>(x), as<T>(bias), as<T>(dx), n, width);
  });
  check("bias gelu backward");
}

void biasDropoutAddCuda(CudaDtype t, const void* x, const void* bias, const void* residual, const void* noise,
                        void* out, int64_t rows, int64_t width, void* stream) {
  const int64_t n = rows * width;
  if (n == 0) return;
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    biasDropoutAddKernel<T><<<gridFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        as<T>(x), as<T>(bias), as<T>(residual), as<T>(noise), as<T>(out), n, width);
  });
  check("bias dropout add");
}

void multiplyCuda(CudaDtype t, const void* a, const void* b, void* out, int64_t n, void* stream) {
  if (n == 0) return;
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    multiplyKernel<T><<<gridFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(as<T>(a), as<T>(b),
                                                                                         as<T>(out), n);
  });
  check("multiply");
}

void columnSumCuda(CudaDtype t, const void* a, void* out, int64_t rows, int64_t width, void* stream) {
  if (width == 0) return;
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    columnSumKernel<T><<<gridFor(width), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(as<T>(a), as<T>(out),
                                                                                             rows, width);
  });
  check("column sum");
}

void addLayerNormCuda(CudaDtype t, const void* x, const void* residual, const void* weight, const void* bias,
                      void* y, void* sum, float* mean, float* rstd, int64_t rows, int64_t width, float eps,
                      void* stream) {
  if (rows == 0) return;
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    addLayerNormKernel<T><<<rowGrid(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        as<T>(x), as<T>(residual), as<T>(weight), as<T>(bias), as<T>(y), as<T>(sum), mean, rstd, width, eps);
  });
  check("layernorm");
}

void addLayerNormBackwardCuda(CudaDtype t, const void* dy, const void* dsum, const void* s, const void* weight,
                              const float* mean, const float* rstd, void* ds, float* dweight, float* dbias,
                              int64_t rows, int64_t width, void* stream) {
  if (rows == 0) return;
  dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto cudaStream = static_cast<cudaStream_t>(stream);
    addLayerNormBackwardKernel<T><<<rowGrid(rows), kThreads, 0, cudaStream>>>(
        as<T>(dy), as<T>(dsum), as<T>(s), as<T>(weight), mean, rstd, as<T>(ds), width);
    layerNormParamGradKernel<T><<<gridFor(width), kThreads, 0, cudaStream>>>(as<T>(dy), as<T>(s), mean, rstd,
                                                                               dweight, dbias, rows, width);
  });
  check("layernorm backward");
}

}  // namespace ptrain::nn::detail

// The fused kernels of nn/fused.h on a CUDA device (fused_kernels.cu), for
// builds with CUDA. No torch types: the caller passes device pointers, the
// storage dtype and its current stream (a cudaStream_t). Arithmetic is
// float32 for every storage dtype, as on the host.
#pragma once

#include <cstdint>

namespace ptrain::nn::detail {

enum class CudaDtype { kFloat, kHalf, kBFloat16 };

// y = softmax(scale * x + mask) per row of `width`; mask row = row % queries (null: none).
void maskedSoftmaxCuda(CudaDtype t, const void* x, const float* mask, void* y, int64_t rows, int64_t queries,
                       int64_t width, float scale, void* stream);
// dx = scale * y * (dy - rowsum(dy * y)).
void maskedSoftmaxBackwardCuda(CudaDtype t, const void* dy, const void* y, void* dx, int64_t rows, int64_t width,
                               float scale, void* stream);
// y = gelu_tanh(x + bias); bias may be null.
void biasGeluCuda(CudaDtype t, const void* x, const void* bias, void* y, int64_t rows, int64_t width, void* stream);
// dx = dy * gelu'(x + bias).
void biasGeluBackwardCuda(CudaDtype t, const void* dy, const void* x, const void* bias, void* dx, int64_t rows,
                          int64_t width, void* stream);
// out = residual + (x + bias) * noise; bias and noise may be null.
void biasDropoutAddCuda(CudaDtype t, const void* x, const void* bias, const void* residual, const void* noise,
                        void* out, int64_t rows, int64_t width, void* stream);
// dx = dy * noise.
void multiplyCuda(CudaDtype t, const void* dy, const void* noise, void* dx, int64_t n, void* stream);
// out[j] = sum over rows of a[r, j], accumulated in float32.
void columnSumCuda(CudaDtype t, const void* a, void* out, int64_t rows, int64_t width, void* stream);
// sum = x + residual (residual may be null: sum is x, not written), y = LayerNorm(sum) * weight + bias;
// mean and rstd per row (float32).
void addLayerNormCuda(CudaDtype t, const void* x, const void* residual, const void* weight, const void* bias,
                      void* y, void* sum, float* mean, float* rstd, int64_t rows, int64_t width, float eps,
                      void* stream);
// ds = LayerNorm's input gradient (+ dsum, may be null); dweight, dbias (float32, width each).
void addLayerNormBackwardCuda(CudaDtype t, const void* dy, const void* dsum, const void* s, const void* weight,
                              const float* mean, const float* rstd, void* ds, float* dweight, float* dbias,
                              int64_t rows, int64_t width, void* stream);

}  // namespace ptrain::nn::detail

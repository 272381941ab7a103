// AdamW as one pass over memory: each element of the parameter, its gradient
// and the two moments is read once and written once. The multi-tensor
// (foreach) form makes about eight passes per tensor (scale, two moment
// updates, square root, divide, add, the update, decay), which on a CPU costs
// memory bandwidth, not arithmetic.
#pragma once

#include <cstdint>

namespace ptrain::detail {

struct AdamwStep {
  float decay_factor;  // 1 - lr * weight_decay, or 1 where the tensor has no decay
  float beta1, beta2;
  float grad_scale;    // applied to the gradient first, e.g. the clipping coefficient
  float inv_sqrt_bias_correction2;  // 1 / sqrt(1 - beta2^t)
  float eps;
  float step_size;     // lr / (1 - beta1^t)
};

// p, g, m, v: n contiguous float32 values each; updates p, m and v in place.
// Splits the range over the intra-op threads.
void adamwUpdate(float* p, const float* g, float* m, float* v, int64_t n, const AdamwStep& s);

#if PTRAIN_WITH_CUDA
// The same update on a CUDA device (adamw_kernel.cu): p, g, m and v in device
// memory, queued on `stream` (a cudaStream_t; the caller's current stream).
void adamwUpdateCuda(float* p, const float* g, float* m, float* v, int64_t n, const AdamwStep& s, void* stream);
#endif

}  // namespace ptrain::detail

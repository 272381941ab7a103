// Half-precision ops on the host where libtorch has no kernel for them.
//
// libtorch's CPU kernels do not cover every dtype in every release: 1.13
// computes float16 neither matrix products nor LayerNorm, GELU, softmax,
// dropout or log-softmax on the host ("... not implemented for 'Half'").
// ptrain's layers ask computeInFloat32() before each such op; where the
// kernel is missing they compute the op in float32 from the low-precision
// values and round the result back to the input's dtype (autograd rounds the
// gradients back the same way), so an fp16 run works on any build and keeps
// its tensors in fp16 between ops.
//
// Whether a kernel exists is found out, not assumed: the first question about
// an (op, dtype) pair runs the op forward and backward on a tiny host tensor
// of that dtype and remembers whether libtorch refused it. The precision
// plugins list missingHostKernels() in the run's log.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain::nn {

// The ops of ptrain's layers whose host kernels may be missing for a dtype.
enum class HostOp {
  kLinear,        // matrix products (linear layers, the output projection)
  kLayerNorm,
  kGelu,
  kAttention,     // scores, softmax and the weighted sum of the values
  kDropout,
  kCrossEntropy,  // log-softmax and the loss over the vocabulary
};

PTRAIN_API const char* hostOpName(HostOp op);
// Whether libtorch computes `op` forward and backward in `dtype` on the host
// (probed once per pair; float32 and float64 are always available).
PTRAIN_API bool hostKernelAvailable(HostOp op, at::ScalarType dtype);
// True when `x` lives on the host in a dtype libtorch has no kernel of `op`
// for: compute `op` in float32 and cast the result back to x's dtype.
PTRAIN_API bool computeInFloat32(HostOp op, const at::Tensor& x);
// Names of the ops libtorch lacks on the host for `dtype`, in HostOp order.
PTRAIN_API std::vector<std::string> missingHostKernels(at::ScalarType dtype);

}  // namespace ptrain::nn

// ptrain's own kernels for the products of a transformer on the host (CPU).
//
// libtorch hands each matrix product to the BLAS, which threads it with its
// own pool (OpenBLAS: pthreads that spin while they wait), beside libtorch's
// OpenMP pool for everything else; on a few cores the two pools take turns at
// the same cores. With the host kernels on, OpenBLAS runs every product on
// the calling thread and ptrain splits products over libtorch's intra-op
// threads itself: a linear layer's rows (and, for its weight gradient, the
// output features) in one block per thread, attention by heads
// (attention.h). One thread pool, the same BLAS kernels.
//
// Workers turn them on from `cpu.kernels: ptrain` (the default);
// `cpu.kernels: libtorch` keeps libtorch's ops. Off until turned on, so
// library users and tests get libtorch's behaviour unless they ask.
#pragma once

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain::nn {

// Turns the host kernels on or off for this process. Returns whether they are
// on afterwards: they stay off where the BLAS is not one ptrain can call and
// hold to one thread (OpenBLAS).
PTRAIN_API bool setHostKernels(bool enabled);
PTRAIN_API bool hostKernelsEnabled();

// y = x W^T (+ b), as at::linear: x [..., in], weight [out, in], bias [out]
// or undefined. The host kernel runs for float32 host tensors when the host
// kernels are on; at::linear otherwise.
PTRAIN_API at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

}  // namespace ptrain::nn

// Gradient helpers the parallel plugins share.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain {

class ProcessGroup;

// Sums the gradients of `params` over `group` in one flat buffer (in the
// gradients' dtype: float32 main gradients under bf16 and fp16), a parameter
// without a gradient counting as zeros, and writes the sums back (creating the
// gradient where there was none). For parameters whose gradient each rank
// computes only part of. The buffer is on `device`, where the group's
// collectives run (the model's device: an offloaded gradient may rest on the
// host). Returns the bytes all-reduced.
PTRAIN_API int64_t allReduceGradients(std::vector<at::Tensor>& params, ProcessGroup& group, at::Device device);

}  // namespace ptrain

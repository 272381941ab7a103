// Parameters built without storage, so that a rank allocates only its slice.
//
// While a DeferredInit lives on a thread, the ptrain::nn layers whose
// parameters a parallel plugin may split (ColumnParallelLinear,
// RowParallelLinear, VocabParallelEmbedding, the parallel convolutions and
// channel norms, the MoE layer's stacked experts, EmbeddingTables) register
// those parameters as deferred tensors: full-size shapes over an empty
// storage (every stride 0), which cost no memory. The runtime
// (engine/runtime.h) builds every model under a DeferredInit; the tensor and
// expert plugins then narrow the deferred parameters to this rank's slice
// (ParallelPlugin::shard, still without storage) and the runtime allocates
// each slice and fills it from the model's rule (StagedModel::parameterInit,
// nn/parameter_init.h), so no rank ever holds a whole tensor of a sharded
// parameter. Without a DeferredInit the layers build ordinary, initialised
// parameters (a model built on its own, in a test or a tool).
//
// A deferred tensor must not be read or computed with: only its sizes mean
// anything until the runtime gives it storage (Tensor::set_data).
//
// Thread-safety: the guard is per thread; nest freely.
#pragma once

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain::nn {

class PTRAIN_API DeferredInit {
 public:
  DeferredInit();
  ~DeferredInit();
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;

  // True while a DeferredInit lives on this thread.
  static bool active();

 private:
  bool previous_;
};

// A host tensor of `sizes` and `dtype` without storage (see above).
PTRAIN_API at::Tensor deferredTensor(at::IntArrayRef sizes, at::ScalarType dtype = at::kFloat);

// What a layer registers for a parameter a parallel plugin may split: a
// deferred tensor of `sizes` under a DeferredInit, make() (an initialised
// tensor of those sizes) otherwise.
template <typename Make>
at::Tensor splittableParameter(at::IntArrayRef sizes, Make make) {
  return DeferredInit::active() ? deferredTensor(sizes) : make();
}

// True when `t` has elements but an empty storage: a deferred tensor (or a
// narrowing of one) that has not been given storage yet.
PTRAIN_API bool isDeferred(const at::Tensor& t);

// `t` narrowed to [start, start + length) along `dim`, in place
// (Tensor::set_data, so the parameter object stays the same): without
// storage when `t` is deferred, a contiguous copy of the slice otherwise.
PTRAIN_API void narrowParameter(at::Tensor& t, int64_t dim, int64_t start, int64_t length);

}  // namespace ptrain::nn

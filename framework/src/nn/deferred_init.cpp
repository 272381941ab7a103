#include "ptrain/nn/deferred_init.h"

#include <torch/torch.h>

namespace ptrain::nn {
namespace {
thread_local bool deferring = false;
}  // namespace

DeferredInit::DeferredInit() : previous_(deferring) { deferring = true; }

DeferredInit::~DeferredInit() { deferring = previous_; }

bool DeferredInit::active() { return deferring; }

at::Tensor deferredTensor(at::IntArrayRef sizes, at::ScalarType dtype) {
  // An empty storage under sizes with every stride 0: libtorch checks a
  // storage's bounds when a view is taken, never when sizes are set, and
  // nothing reads a deferred tensor's elements.
  at::Tensor t = at::empty({0}, at::TensorOptions(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, std::vector<int64_t>(sizes.size(), 0));
  return t;
}

bool isDeferred(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 && t.has_storage() && t.storage().nbytes() == 0;
}

void narrowParameter(at::Tensor& t, int64_t dim, int64_t start, int64_t length) {
  torch::NoGradGuard noGrad;
  if (isDeferred(t)) {
    std::vector<int64_t> sizes = t.sizes().vec();
    sizes[static_cast<size_t>(dim)] = length;
    t.set_data(deferredTensor(sizes, t.scalar_type()));
    return;
  }
  t.set_data(t.narrow(dim, start, length).clone(at::MemoryFormat::Contiguous));
}

}  // namespace ptrain::nn

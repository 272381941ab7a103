#include "ptrain/nn/recompute.h"

#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>
#if PTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace ptrain::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs to run fn again: the function, and the generators'
// states when the first run began.
struct Replay : torch::CustomClassHolder {
  RecomputedFunction fn;
  at::Tensor cpuState;
  at::Tensor cudaState;  // undefined without a CUDA device
  int cudaDevice = -1;
};

void captureRng(Replay& r) {
  r.cpuState = at::detail::getDefaultCPUGenerator().get_state();
#if PTRAIN_WITH_CUDA
  if (at::cuda::is_available()) {
    r.cudaDevice = at::cuda::current_device();
    r.cudaState = at::cuda::detail::getDefaultCUDAGenerator(r.cudaDevice).get_state();
  }
#endif
}

void restoreRng(const Replay& r) {
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  cpu.set_state(r.cpuState);
#if PTRAIN_WITH_CUDA
  if (r.cudaState.defined()) {
    at::Generator cuda = at::cuda::detail::getDefaultCUDAGenerator(r.cudaDevice);
    cuda.set_state(r.cudaState);
  }
#endif
}

struct RecomputeFn : torch::autograd::Function<RecomputeFn> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList inputs, RecomputedFunction* fn) {
    auto replay = c10::make_intrusive<Replay>();
    replay->fn = std::move(*fn);
    captureRng(*replay);
    std::vector<at::Tensor> detached;
    for (const auto& t : inputs) detached.push_back(t.detach());
    at::Tensor out;
    {
      torch::NoGradGuard noGrad;
      out = replay->fn(detached);
    }
    ctx->save_for_backward(std::vector<at::Tensor>(inputs.begin(), inputs.end()));
    ctx->saved_data["replay"] = c10::IValue::make_capsule(replay);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto replay = c10::static_intrusive_pointer_cast<Replay>(ctx->saved_data["replay"].toCapsule());
    std::vector<at::Tensor> inputs;
    for (const auto& t : saved) inputs.push_back(t.detach().requires_grad_(t.requires_grad()));
    // Replay the generators, and leave them where this backward found them.
    Replay now;
    captureRng(now);
    restoreRng(*replay);
    at::Tensor out;
    {
      torch::AutoGradMode grad(true);
      out = replay->fn(inputs);
    }
    restoreRng(now);
    if (out.requires_grad()) torch::autograd::backward({out}, {grads[0]});
    variable_list result;
    for (const auto& t : inputs) result.push_back(t.requires_grad() ? t.grad() : at::Tensor());
    result.push_back(at::Tensor());  // fn
    return result;
  }
};

}  // namespace

at::Tensor recomputed(RecomputedFunction fn, const std::vector<at::Tensor>& inputs) {
  // Nothing to save under no grad (evaluation): just the function.
  if (!torch::GradMode::is_enabled()) return fn(inputs);
  return RecomputeFn::apply(at::TensorList(inputs), &fn);
}

}  // namespace ptrain::nn

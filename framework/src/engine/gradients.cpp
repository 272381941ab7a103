#include "ptrain/engine/gradients.h"

#include <torch/torch.h>

#include "ptrain/comm/process_group.h"

namespace ptrain {

int64_t allReduceGradients(std::vector<at::Tensor>& params, ProcessGroup& group, at::Device device) {
  if (params.empty()) return 0;
  int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  const at::Tensor& first = params.front();
  const auto dtype = first.grad().defined() ? first.grad().scalar_type() : first.scalar_type();
  at::Tensor buffer = torch::zeros({total}, first.options().dtype(dtype).device(device).requires_grad(false));
  int64_t offset = 0;
  for (const auto& p : params) {
    if (p.grad().defined()) buffer.narrow(0, offset, p.numel()).copy_(p.grad().reshape({-1}));
    offset += p.numel();
  }
  group.allreduce(buffer)->wait();
  offset = 0;
  for (auto& p : params) {
    at::Tensor slice = buffer.narrow(0, offset, p.numel()).view(p.sizes());
    if (p.mutable_grad().defined()) p.mutable_grad().copy_(slice);
    else p.mutable_grad() = slice.clone();
    offset += p.numel();
  }
  return total * static_cast<int64_t>(buffer.element_size());
}

}  // namespace ptrain

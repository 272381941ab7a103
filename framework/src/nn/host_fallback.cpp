#include "ptrain/nn/host_fallback.h"

#include <torch/torch.h>

#include <map>
#include <mutex>

namespace ptrain::nn {
namespace {

constexpr HostOp kAllOps[] = {HostOp::kLinear,    HostOp::kLayerNorm, HostOp::kGelu,
                              HostOp::kAttention, HostOp::kDropout,   HostOp::kCrossEntropy};

// Runs `op` forward and backward on tiny host tensors of `dtype`, with
// libtorch's own kernels (never ptrain's, which would ask this again).
void runProbe(HostOp op, at::ScalarType dtype) {
  torch::AutoGradMode gradients(true);
  const auto options = torch::TensorOptions().dtype(dtype);
  auto input = [&](std::vector<int64_t> shape) {
    return torch::linspace(-1.0, 1.0, c10::multiply_integers(shape), torch::TensorOptions().dtype(torch::kFloat32))
        .view(shape)
        .to(dtype)
        .requires_grad_(true);
  };
  at::Tensor out;
  switch (op) {
    case HostOp::kLinear:
      out = at::linear(input({2, 3, 4}), input({5, 4}), input({5}));
      break;
    case HostOp::kLayerNorm:
      out = at::layer_norm(input({3, 4}), {4}, input({4}), input({4}), 1e-5);
      break;
    case HostOp::kGelu:
      out = torch::gelu(input({3, 4}), "tanh");
      break;
    case HostOp::kAttention: {
      at::Tensor q = input({2, 3, 4});
      at::Tensor probs = torch::softmax(torch::baddbmm(torch::zeros({3, 3}, options), q, q.transpose(1, 2), 1.0, 0.5), -1);
      out = torch::bmm(probs, q);
      break;
    }
    case HostOp::kDropout:
      out = torch::dropout(input({3, 4}), 0.5, true);
      break;
    case HostOp::kCrossEntropy: {
      at::Tensor logits = input({3, 4});
      out = torch::nn::functional::cross_entropy(logits, torch::tensor({0, 1, 3}, torch::kInt64)) +
            std::get<0>(logits.max(1)).exp().sum().log();
      break;
    }
  }
  out.to(torch::kFloat32).sum().backward();
}

struct Probes {
  std::mutex mutex;
  std::map<std::pair<HostOp, at::ScalarType>, bool> available;
};

Probes& probes() {
  static Probes p;
  return p;
}

}  // namespace

const char* hostOpName(HostOp op) {
  switch (op) {
    case HostOp::kLinear: return "linear";
    case HostOp::kLayerNorm: return "layer_norm";
    case HostOp::kGelu: return "gelu";
    case HostOp::kAttention: return "attention";
    case HostOp::kDropout: return "dropout";
    case HostOp::kCrossEntropy: return "cross_entropy";
  }
  return "?";
}

bool hostKernelAvailable(HostOp op, at::ScalarType dtype) {
  if (dtype == at::kFloat || dtype == at::kDouble) return true;
  Probes& p = probes();
  std::lock_guard<std::mutex> lock(p.mutex);
  auto [it, inserted] = p.available.try_emplace({op, dtype}, true);
  if (inserted) {
    try {
      runProbe(op, dtype);
    } catch (const c10::Error&) {
      // libtorch's "... not implemented for 'Half'": no kernel for this dtype.
      it->second = false;
    }
  }
  return it->second;
}

bool computeInFloat32(HostOp op, const at::Tensor& x) {
  if (!x.defined() || !x.is_cpu()) return false;
  const at::ScalarType dtype = x.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16) return false;
  return !hostKernelAvailable(op, dtype);
}

std::vector<std::string> missingHostKernels(at::ScalarType dtype) {
  std::vector<std::string> out;
  for (HostOp op : kAllOps)
    if (!hostKernelAvailable(op, dtype)) out.emplace_back(hostOpName(op));
  return out;
}

}  // namespace ptrain::nn

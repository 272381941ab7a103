#include "ptrain/nn/host_fallback.h"

#include <torch/torch.h>

#include <atomic>
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

// What is known of each (op, half dtype): 0 not probed yet, 1 kernel
// available, -1 missing. Read on every op of a half-precision model, so
// lock-free once probed; probing itself is serialised.
constexpr size_t kOps = sizeof(kAllOps) / sizeof(kAllOps[0]);
std::atomic<int> g_known[kOps][2];
std::mutex g_probing;

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
  if (dtype != at::kHalf && dtype != at::kBFloat16) return true;
  std::atomic<int>& known = g_known[static_cast<size_t>(op)][dtype == at::kHalf ? 0 : 1];
  int state = known.load(std::memory_order_acquire);
  if (state == 0) {
    std::lock_guard<std::mutex> lock(g_probing);
    state = known.load(std::memory_order_acquire);
    if (state == 0) {
      state = 1;
      try {
        runProbe(op, dtype);
      } catch (const c10::Error&) {
        // libtorch's "... not implemented for 'Half'": no kernel for this dtype.
        state = -1;
      }
      known.store(state, std::memory_order_release);
    }
  }
  return state > 0;
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

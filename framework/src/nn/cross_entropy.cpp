#include "ptrain/nn/cross_entropy.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>

#include "ptrain/comm/process_group.h"
#include "ptrain/nn/host_fallback.h"

namespace ptrain::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// In place, over the tensor-parallel group.
void allReduceInPlace(at::Tensor& t, const TensorParallelState& tp, ReduceOp op) {
  AllreduceOptions opts;
  opts.op = op;
  tp.group->allreduce(t, opts)->wait();
  tp.comm_bytes += t.numel() * static_cast<int64_t>(t.element_size());
}

// Entries [validLocal, k) of this rank's slice are padding.
int64_t validLocalEntries(int64_t validVocab, int64_t start, int64_t k) {
  return std::clamp<int64_t>(validVocab - start, 0, k);
}

struct VocabParallelCrossEntropyFn : torch::autograd::Function<VocabParallelCrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            int64_t validVocab, const TensorParallelState* tp, at::ScalarType computeDtype) {
    const int64_t k = logits.size(-1);
    const int64_t start = static_cast<int64_t>(tp->rank) * k;
    // A working copy in the compute dtype: it becomes the softmax saved for backward.
    at::Tensor x = logits.reshape({-1, k}).to(computeDtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
    const at::Tensor t = targets.reshape({-1});
    const int64_t validLocal = validLocalEntries(validVocab, start, k);
    if (validLocal < k) x.narrow(1, validLocal, k - validLocal).fill_(kNegInf);

    // Subtracting the global max keeps exp() in range; every rank subtracts
    // the same value, so the slices stay one softmax.
    at::Tensor maxLogit = std::get<0>(x.max(1)).contiguous();
    allReduceInPlace(maxLogit, *tp, ReduceOp::kMax);
    x.sub_(maxLogit.unsqueeze(1));

    // The target's logit lives on exactly one rank; the others add 0.
    at::Tensor inRange = (t >= start).logical_and(t < start + k);
    at::Tensor local = (t - start).masked_fill(inRange.logical_not(), 0);
    at::Tensor predicted = x.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(inRange.logical_not(), 0.0)
                               .contiguous();
    allReduceInPlace(predicted, *tp, ReduceOp::kSum);

    x.exp_();
    at::Tensor sumExp = x.sum(1).contiguous();
    allReduceInPlace(sumExp, *tp, ReduceOp::kSum);
    at::Tensor loss = (sumExp.log() - predicted).to(torch::kFloat32);

    x.div_(sumExp.unsqueeze(1));  // softmax over the whole vocabulary, this rank's slice
    ctx->save_for_backward({x, local, inRange});
    ctx->saved_data["shape"] = logits.sizes();
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss.view(targets.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    // d loss / d logit_j = softmax_j - [j == target], scaled by the incoming gradient.
    at::Tensor grad = saved[0].clone();
    grad.scatter_add_(1, saved[1].unsqueeze(1), saved[2].to(grad.scalar_type()).neg().unsqueeze(1));
    grad.mul_(grads[0].reshape({-1, 1}).to(grad.scalar_type()));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    grad = grad.view(ctx->saved_data["shape"].toIntVector()).to(dtype);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets, int64_t validVocab,
                                     const TensorParallelState* tp, bool inLogitsDtype) {
  PTRAIN_CHECK(logits.dim() == targets.dim() + 1, "vocabParallelCrossEntropy: logits ", logits.sizes(),
               " do not match targets ", targets.sizes());
  const bool lowPrecision = inLogitsDtype && logits.scalar_type() != torch::kFloat64 &&
                            !computeInFloat32(HostOp::kCrossEntropy, logits);
  const at::ScalarType computeDtype = lowPrecision ? logits.scalar_type() : torch::kFloat32;
  if (!isActive(tp)) {
    PTRAIN_CHECK(validVocab >= 1 && validVocab <= logits.size(-1), "vocabParallelCrossEntropy: validVocab ",
                 validVocab, " for ", logits.size(-1), " logits");
    const int64_t v = validVocab;
    at::Tensor x = v < logits.size(-1) ? logits.narrow(-1, 0, v) : logits;
    at::Tensor perToken = torch::nn::functional::cross_entropy(
        x.reshape({-1, v}).to(computeDtype), targets.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    return perToken.to(torch::kFloat32).view(targets.sizes());
  }
  PTRAIN_CHECK(validVocab >= 1 && validVocab <= logits.size(-1) * tp->size, "vocabParallelCrossEntropy: validVocab ",
               validVocab, " for ", logits.size(-1), " x ", tp->size, " logits");
  return VocabParallelCrossEntropyFn::apply(logits, targets, validVocab, tp, computeDtype);
}

at::Tensor vocabParallelArgmax(const at::Tensor& logits, int64_t validVocab, const TensorParallelState* tp) {
  torch::NoGradGuard noGrad;
  const int64_t k = logits.size(-1);
  std::vector<int64_t> outShape = logits.sizes().vec();
  outShape.pop_back();
  if (!isActive(tp)) {
    return logits.narrow(-1, 0, std::min(validVocab, k)).argmax(-1);
  }
  const int64_t start = static_cast<int64_t>(tp->rank) * k;
  at::Tensor x = logits.reshape({-1, k}).to(torch::kFloat32, false, true);
  const int64_t validLocal = validLocalEntries(validVocab, start, k);
  if (validLocal < k) x.narrow(1, validLocal, k - validLocal).fill_(kNegInf);
  auto [value, index] = x.max(1);
  // Every rank's best, in rank order; the first largest wins, which is the
  // lowest id on ties, as a single rank's argmax.
  at::Tensor values = allGatherAlong(value.unsqueeze(0), *tp, 0);         // [n, rows]
  at::Tensor ids = allGatherAlong((index + start).unsqueeze(0), *tp, 0);  // [n, rows]
  at::Tensor best = values.argmax(0);
  return ids.gather(0, best.unsqueeze(0)).squeeze(0).view(outShape);
}

}  // namespace ptrain::nn

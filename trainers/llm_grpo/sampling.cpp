#include "sampling.h"

#include <torch/torch.h>

#include "ptrain/core/error.h"

namespace ptrain::grpo {

at::Tensor samplingProbs(const at::Tensor& logits, const SamplingOptions& o) {
  PTRAIN_CHECK(logits.dim() == 2, "samplingProbs: logits must be [rows, vocab], got ", logits.sizes());
  PTRAIN_CHECK(o.temperature >= 0 && o.top_p > 0 && o.top_p <= 1, "samplingProbs: temperature ", o.temperature,
               " and top_p ", o.top_p, " out of range");
  const at::Tensor z = logits.to(torch::kFloat32);
  if (o.temperature == 0) {
    return torch::one_hot(z.argmax(-1), z.size(-1)).to(torch::kFloat32);
  }
  at::Tensor scaled = z / o.temperature;
  const double negInf = -std::numeric_limits<double>::infinity();
  if (o.top_k > 0 && o.top_k < z.size(-1)) {
    const at::Tensor kth = std::get<0>(scaled.topk(o.top_k, -1)).select(-1, o.top_k - 1).unsqueeze(-1);
    scaled = scaled.masked_fill(scaled.lt(kth), negInf);
  }
  at::Tensor probs = torch::softmax(scaled, -1);
  if (o.top_p < 1) {
    auto [sorted, order] = probs.sort(-1, /*descending=*/true);
    // Keep a token when the mass before it is still below top_p.
    const at::Tensor before = sorted.cumsum(-1) - sorted;
    const at::Tensor dropSorted = before.ge(o.top_p);
    const at::Tensor drop = torch::zeros_like(dropSorted).scatter(-1, order, dropSorted);
    probs = probs.masked_fill(drop, 0.0);
    probs = probs / probs.sum(-1, /*keepdim=*/true);
  }
  return probs;
}

at::Tensor sampleTokens(const at::Tensor& logits, const SamplingOptions& options, at::Generator& generator) {
  const at::Tensor probs = samplingProbs(logits, options).cpu();
  return at::multinomial(probs, 1, /*replacement=*/false, generator).squeeze(-1).to(logits.device());
}

}  // namespace ptrain::grpo

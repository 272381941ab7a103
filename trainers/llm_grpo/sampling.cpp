#include "sampling.h"

#include "ptrain/nn/parameter_init.h"

#include <torch/torch.h>

#include <algorithm>

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

at::Tensor sampleTokens(const at::Tensor& logits, const SamplingOptions& options,
                        std::vector<at::Generator>& generators) {
  const at::Tensor probs = samplingProbs(logits, options).cpu();
  const int64_t rows = probs.size(0), vocab = probs.size(1);
  PTRAIN_CHECK(static_cast<int64_t>(generators.size()) == rows, "sampleTokens: ", generators.size(),
               " generators for ", rows, " rows");
  at::Tensor uniform = torch::empty({rows, 1}, torch::kFloat32);
  for (int64_t r = 0; r < rows; ++r) {
    // (0, 1): a draw of exactly 0 would pick the first token even at probability 0.
    uniform[r][0] = std::max(torch::rand({1}, generators[static_cast<size_t>(r)]).item<float>(), 1e-7f);
  }
  // The first token whose cumulative probability reaches the draw.
  const at::Tensor cdf = probs.cumsum(-1);
  at::Tensor tokens = cdf.lt(uniform).sum(-1).clamp_max(vocab - 1);
  // Rounding can leave the last cumulative value under the draw: the most
  // likely token then, never one of probability 0.
  const at::Tensor impossible = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).le(0);
  tokens = torch::where(impossible, probs.argmax(-1), tokens);
  return tokens.to(logits.device());
}

at::Generator rowGenerator(uint64_t seed, int64_t row) {
  // splitmix64 of the pair: nearby seeds and rows give unrelated streams.
  uint64_t z = seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(row) + 0x632BE59BD9B4E019ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return nn::seededGenerator(z);
}

}  // namespace ptrain::grpo

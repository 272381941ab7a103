#include "ptrain/nn/parallel_layers.h"

#include <torch/torch.h>

namespace ptrain::nn {

// Weights ~ N(0, init_std) and zero biases, GPT-2 style. Drawn full-size from
// torch's default generator, so equal seeds give equal weights whatever the
// layout.
ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t inFeatures, int64_t outFeatures, bool withBias,
                                                   double initStd)
    : in_features(inFeatures), out_features(outFeatures) {
  weight = register_parameter("weight", torch::randn({outFeatures, inFeatures}) * initStd);
  if (withBias) bias = register_parameter("bias", torch::zeros({outFeatures}));
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& input) {
  return torch::nn::functional::linear(input, weight, bias);
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t inFeatures, int64_t outFeatures, bool withBias, double initStd)
    : in_features(inFeatures), out_features(outFeatures) {
  weight = register_parameter("weight", torch::randn({outFeatures, inFeatures}) * initStd);
  if (withBias) bias = register_parameter("bias", torch::zeros({outFeatures}));
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  return torch::nn::functional::linear(input, weight, bias);
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t numEmbeddings, int64_t dim, double initStd)
    : num_embeddings(numEmbeddings), embedding_dim(dim) {
  weight = register_parameter("weight", torch::randn({numEmbeddings, dim}) * initStd);
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  return torch::embedding(weight, ids);
}

}  // namespace ptrain::nn

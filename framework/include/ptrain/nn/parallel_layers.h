// Parallel-aware building blocks shared by every model.
//
// A model declares its tensor-parallel intent by building its linears and
// embeddings from these modules (Megatron's layer semantics):
//   ColumnParallelLinear   weight split along the output dimension
//   RowParallelLinear      weight split along the input dimension
//   VocabParallelEmbedding rows of the vocabulary split across ranks
// On one rank they compute exactly torch's Linear / Embedding. Parameters are
// always created full-size (so a run of any layout starts from the same
// initialisation); the tensor plugin slices them to its rank.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "ptrain/core/error.h"

namespace ptrain::nn {

enum class ParallelStyle { kColumn, kRow, kVocab };

class PTRAIN_API ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(int64_t inFeatures, int64_t outFeatures, bool bias = true, double initStd = 0.02);
  at::Tensor forward(const at::Tensor& input);

  int64_t in_features;
  int64_t out_features;  // full (unsharded) size
  at::Tensor weight;     // [out_features, in_features]
  at::Tensor bias;       // [out_features] or undefined
};
TORCH_MODULE(ColumnParallelLinear);

class PTRAIN_API RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(int64_t inFeatures, int64_t outFeatures, bool bias = true, double initStd = 0.02);
  at::Tensor forward(const at::Tensor& input);

  int64_t in_features;  // full (unsharded) size
  int64_t out_features;
  at::Tensor weight;    // [out_features, in_features]
  at::Tensor bias;      // [out_features] or undefined
};
TORCH_MODULE(RowParallelLinear);

class PTRAIN_API VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(int64_t numEmbeddings, int64_t dim, double initStd = 0.02);
  at::Tensor forward(const at::Tensor& ids);

  int64_t num_embeddings;  // full vocabulary size
  int64_t embedding_dim;
  at::Tensor weight;       // [num_embeddings, embedding_dim]
};
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace ptrain::nn

#include "ptrain/nn/parallel_layers.h"

#include <torch/torch.h>

#include "ptrain/nn/deferred_init.h"
#include "ptrain/nn/fused.h"
#include "ptrain/nn/host_fallback.h"
#include "ptrain/nn/host_kernels.h"

namespace ptrain::nn {

const char* toString(ParallelStyle style) {
  switch (style) {
    case ParallelStyle::kColumn: return "column";
    case ParallelStyle::kRow: return "row";
    case ParallelStyle::kVocab: return "vocab";
  }
  return "?";
}

ParallelLayer::~ParallelLayer() = default;

void ParallelLayer::setTensorParallel(std::shared_ptr<const TensorParallelState> state) { tp_ = std::move(state); }

// Weights ~ N(0, init_std) from torch's default generator and zero biases,
// GPT-2 style, for a layer built on its own; under a DeferredInit (a runtime's
// build) the parameters the tensor plugin may split come without storage, and
// the runtime draws this rank's slice from the model's rule.
ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t inFeatures, int64_t outFeatures, bool withBias,
                                                   double initStd)
    : in_features(inFeatures), out_features(outFeatures) {
  weight = register_parameter(
      "weight", splittableParameter({outFeatures, inFeatures}, [&] { return torch::randn({outFeatures, inFeatures}) * initStd; }));
  if (withBias) bias = register_parameter("bias", splittableParameter({outFeatures}, [&] { return torch::zeros({outFeatures}); }));
}

ColumnParallelLinearImpl::~ColumnParallelLinearImpl() = default;

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& input) {
  const at::Tensor bias = skip_bias_add ? at::Tensor() : this->bias;
  if (!parallel()) return ptrain::nn::linear(input, weight, bias);
  // Every rank needs the whole input; its gradient is a partial sum per rank
  // (each rank's output features see it through their own weight rows).
  at::Tensor x = sequenceParallel() ? gatherFromSequenceParallelRegion(input, *tp_, sequence_dim)
                                    : copyToTpRegion(input, *tp_);
  at::Tensor out = ptrain::nn::linear(x, weight, bias);
  return gather_output ? gatherFromTpRegion(out, *tp_) : out;
}

std::vector<std::pair<std::string, int>> ColumnParallelLinearImpl::splitParameters() const {
  std::vector<std::pair<std::string, int>> out{{"weight", 0}};
  if (bias.defined()) out.emplace_back("bias", 0);
  return out;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t inFeatures, int64_t outFeatures, bool withBias, double initStd)
    : in_features(inFeatures), out_features(outFeatures) {
  weight = register_parameter(
      "weight", splittableParameter({outFeatures, inFeatures}, [&] { return torch::randn({outFeatures, inFeatures}) * initStd; }));
  // Replicated: every rank adds it after the reduction.
  if (withBias) bias = register_parameter("bias", torch::zeros({outFeatures}));
}

RowParallelLinearImpl::~RowParallelLinearImpl() = default;

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  const at::Tensor bias = skip_bias_add ? at::Tensor() : this->bias;
  if (!parallel()) return ptrain::nn::linear(input, weight, bias);
  at::Tensor x = input_is_parallel ? input : scatterToTpRegion(input, *tp_);
  at::Tensor partial = ptrain::nn::linear(x, weight);
  at::Tensor out = sequenceParallel() ? reduceScatterToSequenceParallelRegion(partial, *tp_, sequence_dim)
                                      : reduceFromTpRegion(partial, *tp_);
  // After the sum: added once, not once per rank.
  return bias.defined() ? out + bias : out;
}

std::vector<std::pair<std::string, int>> RowParallelLinearImpl::splitParameters() const { return {{"weight", 1}}; }

std::vector<std::string> RowParallelLinearImpl::sequenceParallelPartialParameters() const {
  if (bias.defined()) return {"bias"};
  return {};
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t numEmbeddings, int64_t dim, double initStd)
    : num_embeddings(numEmbeddings), embedding_dim(dim) {
  weight = register_parameter(
      "weight", splittableParameter({numEmbeddings, dim}, [&] { return torch::randn({numEmbeddings, dim}) * initStd; }));
}

VocabParallelEmbeddingImpl::~VocabParallelEmbeddingImpl() = default;

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  if (!parallel()) return torch::embedding(weight, ids);
  const int64_t rows = weight.size(0);
  const int64_t start = static_cast<int64_t>(tp_->rank) * rows;
  // Ids of other ranks look up row 0 and are zeroed: exactly one rank
  // contributes each token's embedding to the sum.
  at::Tensor outside = (ids < start).logical_or(ids >= start + rows);
  at::Tensor local = (ids - start).masked_fill(outside, 0);
  at::Tensor partial = torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduceFromTpRegion(partial, *tp_);
}

at::Tensor VocabParallelEmbeddingImpl::projectToVocab(const at::Tensor& hidden) {
  if (!parallel()) return ptrain::nn::linear(hidden, weight);
  at::Tensor x = sequenceParallel() ? gatherFromSequenceParallelRegion(hidden, *tp_, sequence_dim)
                                    : copyToTpRegion(hidden, *tp_);
  return ptrain::nn::linear(x, weight);
}

std::vector<std::pair<std::string, int>> VocabParallelEmbeddingImpl::splitParameters() const {
  return {{"weight", 0}};
}

at::Tensor shardedDropout(const at::Tensor& shard, double p, bool training, int64_t dim, int numShards, int index) {
  if (!training || p <= 0 || shard.numel() == 0) return shard;
  if (computeInFloat32(HostOp::kDropout, shard)) {
    return shardedDropout(shard.to(at::kFloat), p, training, dim, numShards, index).to(shard.scalar_type());
  }
  if (numShards <= 1) return torch::dropout(shard, p, true);
  return shard * dropoutNoise(shard, p, dim, numShards, index);
}

}  // namespace ptrain::nn

// Parallel-aware building blocks shared by every model.
//
// A model declares its tensor-parallel intent by building its linears and
// embeddings from these modules (Megatron's layer semantics):
//   ColumnParallelLinear   weight split along the output dimension
//   RowParallelLinear      weight split along the input dimension
//   VocabParallelEmbedding rows of the vocabulary split across ranks
// On one rank (no TensorParallelState, or one of size 1) they compute exactly
// torch's Linear / Embedding. Parameters are declared full-size (so a run of
// any layout starts from the same initialisation): in a runtime's build
// (nn::DeferredInit, deferred_init.h) the ones the tensor plugin splits come
// without storage, the plugin narrows them to its rank (shardTensorParallel,
// tensor_parallel.h) and the runtime allocates and draws only that slice; a
// layer built on its own draws N(0, init_std) weights and zero biases from
// torch's default generator. The tensor plugin then hands each layer the state
// with setTensorParallel().
//
// Under tensor parallelism (see docs/tensor_parallel.md):
//   column: input -> copyToTpRegion (or, with sequence parallelism, an
//           all-gather of the sequence shards) -> x W_r^T + b_r -> output
//           features of this rank (all of them when gather_output)
//   row:    input features of this rank -> x W_r^T -> all-reduce (or, with
//           sequence parallelism, reduce-scatter to sequence shards) -> + b
//   vocab:  ids outside this rank's rows read zeros; the partial embeddings
//           are all-reduced, so every rank gets the full embedding
//
// Thread-safety: one thread at a time (torch modules are not thread-safe).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "ptrain/core/error.h"
#include "ptrain/nn/tp_comm.h"

namespace ptrain::nn {

enum class ParallelStyle { kColumn, kRow, kVocab };
PTRAIN_API const char* toString(ParallelStyle style);

// What every tensor-parallel layer tells the tensor plugin, and the state it
// runs with. Not a module itself: the layers below are modules and this.
class PTRAIN_API ParallelLayer {
 public:
  virtual ~ParallelLayer();

  virtual ParallelStyle parallelStyle() const = 0;
  // Parameters the layer splits across the tensor-parallel group, by local
  // name ("weight", "bias"), with the dimension they are split along. The
  // others are replicated.
  virtual std::vector<std::pair<std::string, int>> splitParameters() const = 0;
  // Replicated parameters whose gradient is a partial sum on each rank under
  // sequence parallelism (each rank sees only its sequence shard): the
  // row-parallel bias. The tensor plugin all-reduces their gradients.
  virtual std::vector<std::string> sequenceParallelPartialParameters() const { return {}; }

  // The state to run with from now on; null: one rank. Parameters must
  // already have this rank's shape (the tensor plugin shards first).
  void setTensorParallel(std::shared_ptr<const TensorParallelState> state);
  const std::shared_ptr<const TensorParallelState>& tensorParallel() const { return tp_; }

 protected:
  // True when a state with more than one rank is set.
  bool parallel() const { return tp_ != nullptr && tp_->active(); }
  bool sequenceParallel() const { return parallel() && tp_->sequence_parallel; }

  std::shared_ptr<const TensorParallelState> tp_;
};

class PTRAIN_API ColumnParallelLinearImpl : public torch::nn::Module, public ParallelLayer {
 public:
  ColumnParallelLinearImpl(int64_t inFeatures, int64_t outFeatures, bool bias = true, double initStd = 0.02);
  ~ColumnParallelLinearImpl() override;
  // input [..., in_features] -> [..., out_features / tp] (this rank's
  // output features), or [..., out_features] when gather_output. Under
  // sequence parallelism `input` is this rank's shard along sequence_dim and
  // the output covers the whole sequence.
  at::Tensor forward(const at::Tensor& input);

  ParallelStyle parallelStyle() const override { return ParallelStyle::kColumn; }
  std::vector<std::pair<std::string, int>> splitParameters() const override;

  int64_t in_features;
  int64_t out_features;        // full (unsharded) size
  bool gather_output = false;  // all-gather the output features on every rank
  // Leave the bias to the caller (Megatron's skip_bias_add), which adds it in
  // a fused op (nn/fused.h: fusedBiasGelu).
  bool skip_bias_add = false;
  int64_t sequence_dim = 1;    // of the input, for sequence parallelism
  at::Tensor weight;           // [out_features (/ tp), in_features]
  at::Tensor bias;             // [out_features (/ tp)] or undefined
};
TORCH_MODULE(ColumnParallelLinear);

class PTRAIN_API RowParallelLinearImpl : public torch::nn::Module, public ParallelLayer {
 public:
  RowParallelLinearImpl(int64_t inFeatures, int64_t outFeatures, bool bias = true, double initStd = 0.02);
  ~RowParallelLinearImpl() override;
  // input [..., in_features / tp] (this rank's features, as a column-parallel
  // layer produces them; [..., in_features] when !input_is_parallel) ->
  // [..., out_features], summed over the group. Under sequence parallelism
  // the output is this rank's shard along sequence_dim.
  at::Tensor forward(const at::Tensor& input);

  ParallelStyle parallelStyle() const override { return ParallelStyle::kRow; }
  std::vector<std::pair<std::string, int>> splitParameters() const override;
  std::vector<std::string> sequenceParallelPartialParameters() const override;

  int64_t in_features;  // full (unsharded) size
  int64_t out_features;
  bool input_is_parallel = true;  // false: split the full input here (scatterToTpRegion)
  // Leave the bias to the caller (Megatron's skip_bias_add), which adds it in
  // a fused op (nn/fused.h: fusedBiasDropoutAdd).
  bool skip_bias_add = false;
  int64_t sequence_dim = 1;       // of the output, for sequence parallelism
  at::Tensor weight;              // [out_features, in_features (/ tp)]
  at::Tensor bias;                // [out_features] or undefined; added after the reduction
};
TORCH_MODULE(RowParallelLinear);

class PTRAIN_API VocabParallelEmbeddingImpl : public torch::nn::Module, public ParallelLayer {
 public:
  VocabParallelEmbeddingImpl(int64_t numEmbeddings, int64_t dim, double initStd = 0.02);
  ~VocabParallelEmbeddingImpl() override;
  // ids [...] in [0, num_embeddings) -> [..., embedding_dim], complete on
  // every rank (one all-reduce under tensor parallelism).
  at::Tensor forward(const at::Tensor& ids);
  // The tied output projection: hidden [..., embedding_dim] -> logits of this
  // rank's vocabulary rows [..., num_embeddings / tp]. Under sequence
  // parallelism `hidden` is this rank's shard along sequence_dim and the
  // logits cover the whole sequence. Feed them to vocabParallelCrossEntropy.
  at::Tensor projectToVocab(const at::Tensor& hidden);

  ParallelStyle parallelStyle() const override { return ParallelStyle::kVocab; }
  std::vector<std::pair<std::string, int>> splitParameters() const override;

  int64_t num_embeddings;  // full vocabulary size
  int64_t embedding_dim;
  int64_t sequence_dim = 1;  // of projectToVocab's input, for sequence parallelism
  at::Tensor weight;         // [num_embeddings (/ tp), embedding_dim]
};
TORCH_MODULE(VocabParallelEmbedding);

// Dropout of one shard of a larger tensor: draws the mask torch::dropout
// would draw for the whole tensor (of shard's shape with dimension `dim`
// times `numShards`) and applies slice `index` of it. Ranks that hold the
// shards of one tensor, with their default generators in the same state, so
// drop exactly what one rank would, and every shard gets its own mask. Costs
// the random draws of the whole tensor. Identity when !training or p == 0.
PTRAIN_API at::Tensor shardedDropout(const at::Tensor& shard, double p, bool training, int64_t dim, int numShards,
                                     int index);

}  // namespace ptrain::nn

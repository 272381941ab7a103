// GPT: a decoder-only transformer (GPT-2 layout, pre-LayerNorm) as a
// StagedModel, built from ptrain::nn parallel layers so that the tensor
// plugin can shard it.
//
//   embed:  x = tokens(ids) + positions(0..T-1)              (dropout)
//   block:  x = x + attn(ln1(x));  x = x + mlp(ln2(x))
//   attn:   qkv = ColumnParallelLinear(h, 3h)  (head-major, see below)
//           causal softmax(q k^T / sqrt(d)) v, then RowParallelLinear(h, h)
//   mlp:    ColumnParallelLinear(h, ffn) -> GELU (tanh) -> RowParallelLinear(ffn, h)
//   head:   ln_f, logits = x E^T (tied to embed.tokens) or ColumnParallelLinear(h, V, no bias),
//           loss = sum over loss_mask of cross-entropy(logits, targets)
//
// qkv layout: output feature f of attn.qkv is (head, part, d) with
//   f = head * 3 * head_dim + part * head_dim + d,  part 0 = q, 1 = k, 2 = v,
// i.e. the weight rows are [heads, 3, head_dim] (Megatron's per-head q,k,v
// interleaving). A contiguous column split over tp ranks therefore hands every
// rank whole heads with their own q, k and v; attention works out the number
// of heads from the weight it holds, so it runs unchanged on a shard.
//
// Parameter names: embed.tokens.weight, embed.positions.weight,
// blocks.<i>.{ln1,ln2}.{weight,bias}, blocks.<i>.attn.{qkv,proj}.{weight,bias},
// blocks.<i>.mlp.{fc1,fc2}.{weight,bias}, head.ln_f.{weight,bias} and, untied,
// head.lm.weight. With tied embeddings the head reads embed.tokens.weight: a
// pipeline split must keep that parameter (and its gradient) in sync between
// the first and the last stage.
//
// Tensor parallelism (tensorParallelPlan / setTensorParallel, see
// ptrain/nn/tensor_parallel.h): qkv, fc1 and an untied lm are column-parallel,
// proj and fc2 row-parallel, embed.tokens vocab-parallel (the tied head uses
// its projectToVocab); logits stay split by vocabulary and go through
// nn::vocabParallelCrossEntropy / vocabParallelArgmax, so the padding entries
// (ids >= valid_vocab, and the rows paddedVocab() adds so that the vocabulary
// divides the group) never count.
// Needs num_attention_heads divisible by the group size. Under sequence
// parallelism the embeddings are scattered along the sequence after their
// dropout, LayerNorms and residuals act on sequence shards (their parameters
// are listed as partial-gradient parameters), and every dropout draws the mask
// of the whole tensor and keeps its shard (nn::shardedDropout), so any layout
// drops exactly what one rank would; seq_length must divide by the group size.
//
// Initialisation (GPT-2): weights ~ N(0, init_std), position embeddings too,
// biases 0, LayerNorm 1/0, attn.proj and mlp.fc2 weights ~ N(0, init_std /
// sqrt(2 * num_layers)) (parameterInit). Each parameter is drawn from a
// counter-based stream of its own (nn/parameter_init.h), seeded by the model's
// base seed and the parameter's name; the base seed is one draw from torch's
// default generator. So equal torch::manual_seed gives equal weights, a
// pipeline stage that builds only some blocks (ModelBuild) gets exactly the
// values the whole model has there, and a tensor-parallel or expert rank that
// draws only its slice (in a runtime, nn::DeferredInit) gets exactly that
// slice of the whole draw.
//
// Thread-safety: one thread at a time (torch modules are not thread-safe).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include "ptrain/engine/model.h"
#include "ptrain/nn/moe.h"
#include "ptrain/nn/parallel_layers.h"
#include "ptrain/nn/tp_comm.h"

namespace ptrain::llm {

struct GptConfig {
  int64_t vocab_size = 16;
  int64_t valid_vocab = 0;       // ids >= valid_vocab are padding, never predicted; 0: vocab_size
  // The embedding (and an untied LM head) has vocab_size rounded up to a
  // multiple of this many rows (Megatron's make_vocab_size_divisible_by); the
  // extra rows are padding like the ids >= valid_vocab. A fixed number, not
  // the tensor-parallel size, so every layout builds the same embedding.
  int64_t make_vocab_size_divisible_by = 1;
  int64_t seq_length = 16;       // number of learned positions: the longest input
  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t num_heads = 4;         // must divide hidden_size
  int64_t ffn_hidden_size = 0;   // 0 -> 4 * hidden_size
  double dropout = 0.0;          // embeddings, attention probabilities, residual branches; train mode only
  double init_std = 0.02;
  bool tie_embeddings = true;
  double layernorm_eps = 1e-5;
  // The output projection's cross-entropy in the logits' dtype (fp16) rather
  // than float32 (Megatron's fp16_lm_cross_entropy).
  bool fp16_lm_cross_entropy = false;
  // Fused kernels (recipe section `fusion`, ptrain/nn/fused.h). The same
  // function either way, to float rounding.
  struct Fusion {
    bool masked_softmax = false;    // attention: mask, scale and softmax in one pass
    bool bias_gelu = false;         // mlp.fc1's bias add and the GELU
    bool layernorm = false;         // every LayerNorm, with the residual add before ln2
    bool bias_dropout_add = false;  // attn.proj's and mlp.fc2's bias, dropout and residual add
  } fusion;

  // Mixture of experts (ptrain/nn/moe.h): with num_experts > 0 every
  // moe_layer_freq-th block (0, freq, 2 freq, ...) has a MoE MLP of
  // num_experts copies of the block's MLP; `moe` holds the routing settings
  // (its sizes and layer number are filled in per block).
  // Selective activation recomputation (model.recompute: selective): the
  // attention core keeps only its input and is recomputed in backward.
  bool recompute_attention_core = false;

  int64_t num_experts = 0;
  int64_t moe_layer_freq = 1;
  nn::MoeConfig moe;

  int64_t ffnSize() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  bool isMoeBlock(int64_t index) const { return num_experts > 0 && index % std::max<int64_t>(1, moe_layer_freq) == 0; }
  // The MoE settings of block `index`.
  nn::MoeConfig moeConfig(int64_t index) const;
  int64_t headDim() const { return hidden_size / num_heads; }
  int64_t validVocab() const { return valid_vocab > 0 ? valid_vocab : vocab_size; }
  // Rows of the embedding: vocab_size rounded up to make_vocab_size_divisible_by.
  int64_t paddedVocab() const {
    const int64_t d = make_vocab_size_divisible_by > 0 ? make_vocab_size_divisible_by : 1;
    return (vocab_size + d - 1) / d * d;
  }
};

using TensorParallelStatePtr = std::shared_ptr<const nn::TensorParallelState>;

class GptEmbeddingImpl : public torch::nn::Module {
 public:
  explicit GptEmbeddingImpl(const GptConfig& config);
  // ids [B, T] -> [B, T, h], or [B, T / tp, h] (this rank's sequence shard)
  // under sequence parallelism.
  at::Tensor forward(const at::Tensor& ids);
  // Decoding: ids [B, t] at positions starts[b] + i (starts [B] int64), whole.
  at::Tensor forwardAt(const at::Tensor& ids, const at::Tensor& starts);
  void setTensorParallel(TensorParallelStatePtr state) { tp_ = std::move(state); }

  nn::VocabParallelEmbedding tokens{nullptr};
  torch::nn::Embedding positions{nullptr};

 private:
  double dropout_;
  TensorParallelStatePtr tp_;
};
TORCH_MODULE(GptEmbedding);

class GptAttentionImpl : public torch::nn::Module {
 public:
  explicit GptAttentionImpl(const GptConfig& config);
  // The output projection's bias is left out under fusion.bias_dropout_add
  // (the block adds it, fused).
  // x [B, T, h] (a sequence shard under sequence parallelism); additiveMask
  // [T', T'] with T' >= T (0 on and below the diagonal, -inf above).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& additiveMask);
  // Decoding with a KV cache: x [B, t, h] holds the tokens at positions
  // starts[b] .. starts[b] + t - 1 of each row; their keys and values are
  // written there into keys/values [B, heads, seq_length, d] (this rank's
  // heads), and each query attends to the cached positions up to its own.
  // Positions after a row's own (a shorter prompt's padding from a batched
  // prefill) are never read. No dropout (inference).
  at::Tensor forwardCached(const at::Tensor& x, const at::Tensor& starts, at::Tensor& keys, at::Tensor& values);
  void setTensorParallel(TensorParallelStatePtr state) { tp_ = std::move(state); }

  nn::ColumnParallelLinear qkv{nullptr};
  nn::RowParallelLinear proj{nullptr};

 private:
  // Scores, mask, softmax, dropout and the product with v, for every head.
  at::Tensor core(const at::Tensor& qkvOut, const at::Tensor& mask);

  int64_t head_dim_;
  double dropout_;
  bool fused_softmax_;
  bool recompute_core_;
  TensorParallelStatePtr tp_;
};
TORCH_MODULE(GptAttention);

class GptMlpImpl : public torch::nn::Module {
 public:
  explicit GptMlpImpl(const GptConfig& config);
  // fc2's bias is left out under fusion.bias_dropout_add (the block adds it, fused).
  at::Tensor forward(const at::Tensor& x);

  nn::ColumnParallelLinear fc1{nullptr};
  nn::RowParallelLinear fc2{nullptr};

 private:
  bool fused_bias_gelu_;
};
TORCH_MODULE(GptMlp);

class GptBlockImpl : public torch::nn::Module {
 public:
  // Block `index` of the model (a MoE block when config.isMoeBlock(index)).
  GptBlockImpl(const GptConfig& config, int64_t index);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& additiveMask);
  // Decoding (GptAttentionImpl::forwardCached).
  at::Tensor forwardCached(const at::Tensor& x, const at::Tensor& starts, at::Tensor& keys, at::Tensor& values);
  void setTensorParallel(TensorParallelStatePtr state);

  torch::nn::LayerNorm ln1{nullptr};
  GptAttention attn{nullptr};
  torch::nn::LayerNorm ln2{nullptr};
  GptMlp mlp{nullptr};      // null in a MoE block
  nn::MoeLayer moe{nullptr};  // null in a dense block

 private:
  at::Tensor residualDropout(const at::Tensor& x);
  // The noise residualDropout would multiply `x` by (undefined without dropout).
  at::Tensor residualNoise(const at::Tensor& x);
  at::Tensor norm(const torch::nn::LayerNorm& ln, const at::Tensor& x);
  // The rest of the block after attention: x + a, then the MLP (or experts).
  at::Tensor afterAttention(const at::Tensor& x, const at::Tensor& a);

  double dropout_;
  GptConfig::Fusion fusion_;
  TensorParallelStatePtr tp_;
};
TORCH_MODULE(GptBlock);

class GptHeadImpl : public torch::nn::Module {
 public:
  GptHeadImpl(const GptConfig& config, nn::VocabParallelEmbedding tiedEmbedding);
  // hidden [B, T, h] -> logits [B, T, V] (V = paddedVocab()), or [B, T, V / tp] (this rank's
  // vocabulary slice) under tensor parallelism.
  at::Tensor forward(const at::Tensor& hidden);

  torch::nn::LayerNorm ln_f{nullptr};
  nn::ColumnParallelLinear lm{nullptr};  // null when tied

 private:
  // Not registered here: the tied weight is owned (and named) by embed.tokens.
  nn::VocabParallelEmbedding tied_{nullptr};
  bool fused_layernorm_;
};
TORCH_MODULE(GptHead);

// The root module: owns the parts `build` names. Blocks are registered
// under their index in the whole model ("blocks.5"), whichever others exist.
// A tied head needs the token embedding, so the head's stage builds the
// embedding too (a pipeline releases what the stage does not own).
class GptModuleImpl : public torch::nn::Module {
 public:
  GptModuleImpl(const GptConfig& config, const ModelBuild& build);

  GptEmbedding embed{nullptr};                 // null when not built
  std::shared_ptr<torch::nn::Module> blocks;   // children "0", "1", ...: the built blocks
  std::map<int, GptBlock> built;               // block index -> block
  GptHead head{nullptr};                       // null when not built
};
TORCH_MODULE(GptModule);

// Keys and values of every block for decoding (GptModel::decodeLogits):
// [rows, this rank's heads, seq_length, head_dim] each, made on first use.
struct KvCache {
  std::vector<at::Tensor> keys, values;  // by block
};

class GptModel : public StagedModel {
 public:
  // The parts `build` names (all by default). Throws ConfigError when the
  // shape is impossible (hidden_size not divisible by num_heads, a size < 1).
  explicit GptModel(const GptConfig& config, const ModelBuild& build = {});
  ~GptModel() override;

  torch::nn::Module& module() override;
  int numBlocks() const override;
  // The parameters of one block, from the configuration (built or not).
  int64_t blockCost(int index) override;
  std::string blockPrefix(int index) const override;
  std::vector<std::string> embedPrefixes() const override;
  std::vector<std::string> headPrefixes() const override;
  // embed.tokens.weight when the embeddings are tied.
  std::vector<std::string> headSharedParameters() const override;

  int64_t numExperts() const override { return config_.num_experts; }
  // The MoE layers this rank built, by prefix ("blocks.0.moe.").
  std::vector<std::pair<std::string, nn::MoeLayerImpl*>> moeLayers() override;

  // micro["tokens"] [B, T] int64, T <= seq_length -> hidden [B, T, h].
  at::Tensor embed(const Batch& micro) override;
  at::Tensor runBlock(int index, const at::Tensor& hidden) override;
  // Sum over micro["loss_mask"] of the cross-entropy against micro["targets"];
  // count = the mask's sum.
  LossOutput head(const at::Tensor& hidden, const Batch& micro) override;

  // Every parallel layer with its prefix; LayerNorm parameters as the
  // sequence-parallel partial-gradient ones.
  TensorParallelPlan tensorParallelPlan() override;
  // Throws ConfigError when num_attention_heads (or, with sequence
  // parallelism, seq_length) is not divisible by the group size.
  void setTensorParallel(TensorParallelStatePtr state) override;

  // tokens [B, T] -> logits [B, T, paddedVocab()] through the whole model (this rank's
  // vocabulary slice under tensor parallelism). Under pipeline parallelism
  // every stage must call it; only the last stage gets the logits (the
  // others an undefined tensor).
  at::Tensor logits(const at::Tensor& tokens);

  // Greedy decoding of many prompts at once (prompts may differ in length).
  // Appends argmax tokens to each prompt until it emits `stopId`, has
  // `maxNew` new tokens, or its input would exceed seq_length. Returns the new
  // tokens of each prompt, ending with `stopId` when the model emitted it. Runs under NoGradGuard in
  // the module's current mode (call module().eval() first for dropout-free
  // decoding). Each step recomputes the whole prefix: at the sequence lengths
  // used here (16-40) that costs less than maintaining a KV cache. Under
  // tensor parallelism every rank of the group must call it with the same
  // prompts (the argmax is taken across the group); under pipeline
  // parallelism every stage must (the last stage picks the tokens and shares
  // them).
  std::vector<std::vector<int64_t>> greedyDecode(const std::vector<std::vector<int64_t>>& prompts,
                                                 int64_t maxNew, int64_t stopId, int64_t padId = 0);

  // The log-probability of `targets` [B, T] under the head's logits of
  // `hidden` (the last blocks' output, as head() takes it): float32 [B, T],
  // differentiable, across the group when the vocabulary is split. What
  // policy-gradient losses (GRPO's actor, its reference) are made of.
  at::Tensor tokenLogProbs(const at::Tensor& hidden, const at::Tensor& targets);
  // The head's logits of `hidden` over the whole valid vocabulary (gathered
  // across the group when it is split; the padding entries dropped):
  // float32 [B, T, validVocab()], differentiable. For the entropy of the
  // policy.
  at::Tensor vocabularyLogits(const at::Tensor& hidden);

  // Decoding with a KV cache: tokens [B, t] at positions starts[b] ..
  // starts[b] + t - 1 of each row (starts [B] int64; a prefill passes 0 and
  // the padded prompts, each step then one token per row at its row's next
  // position) -> logits [B, t, paddedVocab()] (this rank's vocabulary slice
  // under tensor parallelism), equal to logits() of each row's whole prefix
  // at those positions. `cache` belongs to these rows. Needs the whole model on
  // this rank (no pipeline) and no sequence parallelism; runs under
  // NoGradGuard in the module's mode (eval for dropout-free decoding). Under
  // tensor parallelism every rank of the group calls it with the same tokens.
  at::Tensor decodeLogits(const at::Tensor& tokens, const at::Tensor& starts, KvCache& cache);

  // GPT-2's initialisation (see the top of this file), drawn from the
  // parameter's own stream.
  std::optional<nn::ParameterInit> parameterInit(const std::string& name,
                                                 const std::vector<int64_t>& fullSizes) const override;

  const GptConfig& config() const { return config_; }
  // The tensor-parallel group the model runs in (null or size 1: none).
  const nn::TensorParallelState* tensorParallel() const { return tp_.get(); }
  // Number of parameter values this rank holds (the tied weight counted
  // once; under tensor parallelism its shards).
  int64_t numParameters() const;

 private:
  const at::Tensor& causalMask(int64_t length, const at::Tensor& like);
  // Where the parameters live (CPU when there are none).
  at::Device device();

  GptConfig config_;
  uint64_t base_seed_ = 0;  // every parameter's stream is parameterSeed(base_seed_, name)
  GptModule root_{nullptr};
  at::Tensor mask_;  // [seq_length, seq_length], additive, cached per dtype/device
  TensorParallelStatePtr tp_;
};

}  // namespace ptrain::llm

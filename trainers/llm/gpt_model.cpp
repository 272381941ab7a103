#include "gpt_model.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ptrain/comm/process_group.h"
#include "ptrain/core/text.h"
#include "ptrain/nn/parameter_seed.h"
#include "ptrain/nn/attention.h"
#include "ptrain/nn/cross_entropy.h"
#include "ptrain/nn/fused.h"
#include "ptrain/nn/ops.h"
#include "ptrain/nn/recompute.h"

namespace ptrain::llm {
namespace {

at::Tensor maybeDropout(const at::Tensor& x, double p, bool training) { return nn::dropout(x, p, training); }

at::Tensor layerNorm(const torch::nn::LayerNorm& ln, const at::Tensor& x) {
  return nn::layerNorm(x, ln->weight, ln->bias, ln->options.eps());
}

bool sequenceParallel(const TensorParallelStatePtr& tp) { return nn::isActive(tp.get()) && tp->sequence_parallel; }

torch::nn::LayerNorm makeLayerNorm(const GptConfig& c) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layernorm_eps));
}

// GPT-2 scales the weights that write into the residual stream by
// 1/sqrt(2 * layers): the stream sums two such branches per layer, and this
// keeps its variance independent of depth at initialisation.
double residualStd(const GptConfig& c) { return c.init_std / std::sqrt(2.0 * static_cast<double>(c.num_layers)); }

}  // namespace

// ---- embedding ----

GptEmbeddingImpl::GptEmbeddingImpl(const GptConfig& c) : dropout_(c.dropout) {
  tokens = register_module("tokens", nn::VocabParallelEmbedding(c.paddedVocab(), c.hidden_size, c.init_std));
  positions = register_module("positions", torch::nn::Embedding(c.seq_length, c.hidden_size));
  // torch's Embedding draws N(0, 1); GPT-2 uses the same small std as every weight.
  torch::NoGradGuard noGrad;
  positions->weight.normal_(0.0, c.init_std);
}

at::Tensor GptEmbeddingImpl::forward(const at::Tensor& ids) {
  const int64_t length = ids.size(1);
  at::Tensor x = tokens(ids) + positions->weight.narrow(0, 0, length);
  // Dropout on the whole tensor, before any sequence split: every rank of a
  // tensor-parallel group draws the mask one rank would.
  x = maybeDropout(x, dropout_, is_training());
  return sequenceParallel(tp_) ? nn::scatterToSequenceParallelRegion(x, *tp_, 1) : x;
}

at::Tensor GptEmbeddingImpl::forwardAt(const at::Tensor& ids, const at::Tensor& starts) {
  const int64_t rows = ids.size(0), length = ids.size(1);
  const at::Tensor where =
      (starts.view({rows, 1}) + torch::arange(length, starts.options()).view({1, length})).view({-1});
  return tokens(ids) + positions->weight.index_select(0, where).view({rows, length, -1});
}

// ---- attention ----

GptAttentionImpl::GptAttentionImpl(const GptConfig& c)
    : head_dim_(c.headDim()),
      dropout_(c.dropout),
      fused_softmax_(c.fusion.masked_softmax),
      recompute_core_(c.recompute_attention_core) {
  qkv = register_module("qkv", nn::ColumnParallelLinear(c.hidden_size, 3 * c.hidden_size, true, c.init_std));
  proj = register_module("proj", nn::RowParallelLinear(c.hidden_size, c.hidden_size, true, residualStd(c)));
  proj->skip_bias_add = c.fusion.bias_dropout_add;
}

at::Tensor GptAttentionImpl::forward(const at::Tensor& x, const at::Tensor& additiveMask) {
  // [B, T, heads * 3 * d]; the whole sequence even when x is a sequence shard
  // (the column-parallel layer gathers it). Heads follow from its width: on a
  // tensor-parallel shard this rank holds only some of them.
  at::Tensor qkvOut = qkv(x);
  const int64_t length = qkvOut.size(1);
  at::Tensor mask = additiveMask.narrow(0, 0, length).narrow(1, 0, length);
  // Selective recomputation: the core's activations (the [T, T] scores and
  // probabilities of every head, the largest per layer) are not kept but
  // recomputed in backward.
  if (recompute_core_ && is_training()) {
    return proj(nn::recomputed([this, mask](const std::vector<at::Tensor>& in) { return core(in[0], mask); }, {qkvOut}));
  }
  return proj(core(qkvOut, mask));
}

at::Tensor GptAttentionImpl::forwardCached(const at::Tensor& x, const at::Tensor& starts, at::Tensor& keys,
                                           at::Tensor& values) {
  const at::Tensor qkvOut = qkv(x);  // [B, t, heads * 3 * d], heads-major (see the top of gpt_model.h)
  const int64_t rows = qkvOut.size(0), length = qkvOut.size(1), heads = qkvOut.size(2) / (3 * head_dim_);
  const at::Tensor parts = qkvOut.view({rows, length, heads, 3, head_dim_}).permute({3, 0, 2, 1, 4});
  const at::Tensor q = parts[0], k = parts[1], v = parts[2];  // [B, heads, t, d]
  // Absolute position of every new token, [B, t].
  const at::Tensor where = starts.view({rows, 1}) + torch::arange(length, starts.options()).view({1, length});
  const at::Tensor index = where.view({rows, 1, length, 1}).expand({rows, heads, length, head_dim_});
  keys.scatter_(2, index, k);
  values.scatter_(2, index, v);
  // Keys up to the furthest new position; query i of row b sees key j <= where[b][i].
  const int64_t span = where.max().item<int64_t>() + 1;
  const at::Tensor keysNow = keys.narrow(2, 0, span), valuesNow = values.narrow(2, 0, span);
  at::Tensor scores = torch::matmul(q, keysNow.transpose(2, 3)) / std::sqrt(static_cast<double>(head_dim_));
  const at::Tensor visible =
      torch::arange(span, starts.options()).view({1, 1, 1, span}).le(where.view({rows, 1, length, 1}));
  scores = scores.to(torch::kFloat32).masked_fill(visible.logical_not(), -std::numeric_limits<float>::infinity());
  const at::Tensor probs = torch::softmax(scores, -1).to(valuesNow.scalar_type());
  const at::Tensor out = torch::matmul(probs, valuesNow);  // [B, heads, t, d]
  return proj(out.permute({0, 2, 1, 3}).reshape({rows, length, heads * head_dim_}));
}

at::Tensor GptAttentionImpl::core(const at::Tensor& qkvOut, const at::Tensor& mask) {
  const int64_t length = qkvOut.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  if (dropout_ <= 0 || !is_training()) return nn::multiHeadAttention(qkvOut, head_dim_, scale, mask, fused_softmax_);
  // Fused: the host kernel applies the dropout noise to the probabilities
  // itself, drawn as dropProbs below would draw it.
  if (fused_softmax_ && nn::hostAttentionApplies(qkvOut)) {
    const int64_t batch = qkvOut.size(0), heads = qkvOut.size(2) / (3 * head_dim_);
    at::Tensor like = torch::empty({batch, heads, length, length}, qkvOut.options());
    at::Tensor noise = nn::isActive(tp_.get()) ? nn::dropoutNoise(like, dropout_, 1, tp_->size, tp_->rank)
                                               : nn::dropoutNoise(like, dropout_);
    return nn::multiHeadAttention(qkvOut, head_dim_, scale, mask, true, noise.view({batch * heads, length, length}));
  }
  // A tensor-parallel rank holds heads [r * heads, (r + 1) * heads) of every
  // sample: draw the mask of all heads and keep those.
  auto dropProbs = [&](const at::Tensor& probs) {
    if (!nn::isActive(tp_.get())) return nn::dropout(probs, dropout_, true);
    const int64_t batch = qkvOut.size(0), heads = probs.size(0) / batch;
    return nn::shardedDropout(probs.view({batch, heads, length, length}), dropout_, true, 1, tp_->size, tp_->rank)
        .view({batch * heads, length, length});
  };
  return nn::batchedAttention(qkvOut, head_dim_, scale, mask, dropProbs, fused_softmax_);
}

// ---- MLP ----

GptMlpImpl::GptMlpImpl(const GptConfig& c) : fused_bias_gelu_(c.fusion.bias_gelu) {
  fc1 = register_module("fc1", nn::ColumnParallelLinear(c.hidden_size, c.ffnSize(), true, c.init_std));
  fc2 = register_module("fc2", nn::RowParallelLinear(c.ffnSize(), c.hidden_size, true, residualStd(c)));
  fc1->skip_bias_add = fused_bias_gelu_;
  fc2->skip_bias_add = c.fusion.bias_dropout_add;
}

at::Tensor GptMlpImpl::forward(const at::Tensor& x) {
  return fc2(fused_bias_gelu_ ? nn::fusedBiasGelu(fc1(x), fc1->bias) : nn::gelu(fc1(x)));
}

// ---- block ----

nn::MoeConfig GptConfig::moeConfig(int64_t index) const {
  nn::MoeConfig m = moe;
  m.num_experts = num_experts;
  m.hidden_size = hidden_size;
  m.ffn_hidden_size = ffnSize();
  m.fused_bias_gelu = fusion.bias_gelu;
  m.layer_number = static_cast<int>(index);
  return m;
}

GptBlockImpl::GptBlockImpl(const GptConfig& c, int64_t index) : dropout_(c.dropout), fusion_(c.fusion) {
  ln1 = register_module("ln1", makeLayerNorm(c));
  attn = register_module("attn", GptAttention(c));
  ln2 = register_module("ln2", makeLayerNorm(c));
  if (c.isMoeBlock(index)) {
    moe = register_module("moe", nn::MoeLayer(c.moeConfig(index)));
  } else {
    mlp = register_module("mlp", GptMlp(c));
  }
}

at::Tensor GptBlockImpl::forward(const at::Tensor& x, const at::Tensor& additiveMask) {
  return afterAttention(x, attn(norm(ln1, x), additiveMask));
}

at::Tensor GptBlockImpl::forwardCached(const at::Tensor& x, const at::Tensor& starts, at::Tensor& keys,
                                       at::Tensor& values) {
  return afterAttention(x, attn->forwardCached(norm(ln1, x), starts, keys, values));
}

at::Tensor GptBlockImpl::afterAttention(const at::Tensor& x, const at::Tensor& a) {
  // h = x + dropout(a + proj bias), then ln2(h): fused as far as the recipe asks.
  at::Tensor h, normed;
  if (fusion_.bias_dropout_add) {
    h = nn::fusedBiasDropoutAdd(a, attn->proj->bias, x, residualNoise(a));
    normed = norm(ln2, h);
  } else if (fusion_.layernorm) {
    std::tie(normed, h) = nn::fusedAddLayerNorm(x, residualDropout(a), ln2->weight, ln2->bias, ln2->options.eps());
  } else {
    h = x + residualDropout(a);
    normed = layerNorm(ln2, h);
  }
  // A MoE block's experts add their own biases.
  at::Tensor m = moe ? moe(normed) : mlp(normed);
  if (fusion_.bias_dropout_add) {
    return nn::fusedBiasDropoutAdd(m, moe ? at::Tensor() : mlp->fc2->bias, h, residualNoise(m));
  }
  return h + residualDropout(m);
}

at::Tensor GptBlockImpl::norm(const torch::nn::LayerNorm& ln, const at::Tensor& x) {
  if (!fusion_.layernorm) return layerNorm(ln, x);
  return nn::fusedAddLayerNorm(x, at::Tensor(), ln->weight, ln->bias, ln->options.eps()).first;
}

at::Tensor GptBlockImpl::residualNoise(const at::Tensor& x) {
  if (dropout_ <= 0 || !is_training()) return at::Tensor();
  // As residualDropout draws it.
  if (sequenceParallel(tp_)) return nn::dropoutNoise(x, dropout_, 1, tp_->size, tp_->rank);
  return nn::dropoutNoise(x, dropout_);
}

void GptBlockImpl::setTensorParallel(TensorParallelStatePtr state) {
  attn->setTensorParallel(state);
  tp_ = std::move(state);
}

at::Tensor GptBlockImpl::residualDropout(const at::Tensor& x) {
  if (dropout_ <= 0 || !is_training()) return x;
  // Sequence shards get their slice of the whole tensor's mask; replicated
  // activations (plain tensor parallelism) draw the same mask on every rank.
  if (sequenceParallel(tp_)) return nn::shardedDropout(x, dropout_, true, 1, tp_->size, tp_->rank);
  return nn::dropout(x, dropout_, true);
}

// ---- head ----

GptHeadImpl::GptHeadImpl(const GptConfig& c, nn::VocabParallelEmbedding tiedEmbedding)
    : fused_layernorm_(c.fusion.layernorm) {
  ln_f = register_module("ln_f", makeLayerNorm(c));
  if (c.tie_embeddings) {
    tied_ = std::move(tiedEmbedding);
  } else {
    lm = register_module("lm", nn::ColumnParallelLinear(c.hidden_size, c.paddedVocab(), false, c.init_std));
  }
}

at::Tensor GptHeadImpl::forward(const at::Tensor& hidden) {
  at::Tensor x = fused_layernorm_
                     ? nn::fusedAddLayerNorm(hidden, at::Tensor(), ln_f->weight, ln_f->bias, ln_f->options.eps()).first
                     : layerNorm(ln_f, hidden);
  return lm ? lm(x) : tied_->projectToVocab(x);
}

// ---- root ----

GptModuleImpl::GptModuleImpl(const GptConfig& c, const ModelBuild& build) {
  // Registration order is the parameter order: embed, blocks, head.
  if (build.embed || (build.head && c.tie_embeddings)) embed = register_module("embed", GptEmbedding(c));
  blocks = register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int i = 0; i < static_cast<int>(c.num_layers); ++i) {
    if (build.buildsBlock(i)) built.emplace(i, blocks->register_module(std::to_string(i), GptBlock(c, i)));
  }
  if (build.head) head = register_module("head", GptHead(c, embed ? embed->tokens : nn::VocabParallelEmbedding(nullptr)));
}

// ---- model ----

GptModel::GptModel(const GptConfig& config, const ModelBuild& build) : config_(config) {
  const GptConfig& c = config_;
  PTRAIN_CHECK_AS(ConfigError, c.vocab_size >= 1, "model.vocab_size: ", c.vocab_size, " must be >= 1");
  PTRAIN_CHECK_AS(ConfigError, c.seq_length >= 1, "model.seq_length: ", c.seq_length, " must be >= 1");
  PTRAIN_CHECK_AS(ConfigError, c.num_layers >= 1, "model.num_layers: ", c.num_layers, " must be >= 1");
  PTRAIN_CHECK_AS(ConfigError, c.num_heads >= 1, "model.num_attention_heads: ", c.num_heads, " must be >= 1");
  PTRAIN_CHECK_AS(ConfigError, c.hidden_size >= 1 && c.hidden_size % c.num_heads == 0,
                  "model.hidden_size: ", c.hidden_size, " is not a multiple of model.num_attention_heads=",
                  c.num_heads, "; use a multiple such as ", c.num_heads * std::max<int64_t>(1, c.hidden_size / c.num_heads));
  PTRAIN_CHECK_AS(ConfigError, c.dropout >= 0 && c.dropout < 1, "model.dropout: ", c.dropout,
                  " is out of range; use [0, 1)");
  // One draw of the default generator seeds every parameter's own stream.
  base_seed_ = nn::modelSeed();
  root_ = GptModule(c, build);
  initialiseParameters();
  const float negInf = -std::numeric_limits<float>::infinity();
  mask_ = torch::full({c.seq_length, c.seq_length}, negInf).triu(1);
}

GptModel::~GptModel() = default;

torch::nn::Module& GptModel::module() { return *root_; }

int GptModel::numBlocks() const { return static_cast<int>(config_.num_layers); }

int64_t GptModel::blockCost(int index) {
  const int64_t h = config_.hidden_size, f = config_.ffnSize();
  // ln1, ln2; qkv; proj; fc1; fc2 (weights and biases); a MoE block has E
  // MLPs and the router.
  const int64_t mlp = (h * f + f) + (f * h + h);
  const int64_t mlps = config_.isMoeBlock(index) ? config_.num_experts * mlp + config_.num_experts * h : mlp;
  return 4 * h + (3 * h * h + 3 * h) + (h * h + h) + mlps;
}

std::optional<nn::ParameterInit> GptModel::parameterInit(const std::string& name,
                                                        const std::vector<int64_t>&) const {
  const bool layerNorm = name.find("ln1.") != std::string::npos || name.find("ln2.") != std::string::npos ||
                         name.find("ln_f.") != std::string::npos;
  if (text::endsWith(name, ".bias")) return nn::ParameterInit::constant(0.0);
  if (layerNorm) return nn::ParameterInit::constant(1.0);
  const bool residual = text::endsWith(name, "attn.proj.weight") || text::endsWith(name, "mlp.fc2.weight") ||
                        text::endsWith(name, "moe.experts.fc2.weight");
  return nn::ParameterInit::normal(parameterSeed(base_seed_, name), 0.0,
                                   residual ? residualStd(config_) : config_.init_std);
}

at::Device GptModel::device() {
  for (const auto& p : root_->parameters()) return p.device();
  return at::kCPU;
}

std::string GptModel::blockPrefix(int index) const { return "blocks." + std::to_string(index) + "."; }

std::vector<std::string> GptModel::embedPrefixes() const { return {"embed."}; }

std::vector<std::string> GptModel::headPrefixes() const { return {"head."}; }

std::vector<std::string> GptModel::headSharedParameters() const {
  if (!config_.tie_embeddings) return {};
  return {"embed.tokens.weight"};
}

const at::Tensor& GptModel::causalMask(int64_t length, const at::Tensor& like) {
  PTRAIN_CHECK(length <= config_.seq_length, "gpt: input of length ", length, " exceeds model.seq_length=",
               config_.seq_length);
  if (mask_.scalar_type() != like.scalar_type() || mask_.device() != like.device()) {
    mask_ = mask_.to(like.device(), like.scalar_type());
  }
  return mask_;
}

at::Tensor GptModel::embed(const Batch& micro) {
  PTRAIN_CHECK(root_->embed, "gpt: embed() on a rank that did not build the embedding");
  const at::Tensor& ids = micro.at("tokens");
  PTRAIN_CHECK(ids.dim() == 2, "gpt: tokens must be [batch, length], got ", ids.sizes());
  PTRAIN_CHECK(ids.size(1) <= config_.seq_length, "gpt: input of length ", ids.size(1),
               " exceeds model.seq_length=", config_.seq_length);
  return root_->embed(ids);
}

at::Tensor GptModel::runBlock(int index, const at::Tensor& hidden) {
  PTRAIN_CHECK(index >= 0 && index < numBlocks(), "gpt: block ", index, " out of range [0, ", numBlocks(), ")");
  auto it = root_->built.find(index);
  PTRAIN_CHECK(it != root_->built.end(), "gpt: block ", index, " is not built on this rank");
  const at::Tensor& mask = causalMask(hidden.size(1), hidden);
  return it->second->forward(hidden, mask);
}

LossOutput GptModel::head(const at::Tensor& hidden, const Batch& micro) {
  PTRAIN_CHECK(root_->head, "gpt: head() on a rank that did not build the head");
  at::Tensor logits = root_->head(hidden);
  const at::Tensor& targets = micro.at("targets");
  const at::Tensor& lossMask = micro.at("loss_mask");
  // fp32 whatever the compute dtype (log-softmax over the vocabulary is where
  // half precision loses the most) unless fp16_lm_cross_entropy, padding
  // entries excluded, and across the group when the vocabulary is split.
  at::Tensor perToken = nn::vocabParallelCrossEntropy(logits, targets, config_.validVocab(), tp_.get(),
                                                      config_.fp16_lm_cross_entropy);
  at::Tensor mask = lossMask.to(perToken.scalar_type());
  LossOutput out;
  out.loss_sum = (perToken * mask).sum();
  out.count = mask.sum().item<double>();
  return out;
}

at::Tensor GptModel::tokenLogProbs(const at::Tensor& hidden, const at::Tensor& targets) {
  PTRAIN_CHECK(root_->head, "gpt: tokenLogProbs() on a rank that did not build the head");
  return -nn::vocabParallelCrossEntropy(root_->head(hidden), targets, config_.validVocab(), tp_.get(), false);
}

at::Tensor GptModel::vocabularyLogits(const at::Tensor& hidden) {
  PTRAIN_CHECK(root_->head, "gpt: vocabularyLogits() on a rank that did not build the head");
  at::Tensor logits = root_->head(hidden);
  if (nn::isActive(tp_.get())) logits = nn::gatherFromTpRegion(logits, *tp_);
  return logits.narrow(-1, 0, config_.validVocab()).to(torch::kFloat32);
}

TensorParallelPlan GptModel::tensorParallelPlan() {
  TensorParallelPlan plan;
  if (root_->embed) plan.layers.emplace_back("embed.tokens.", root_->embed->tokens.get());
  for (auto& [i, built] : root_->built) {
    GptBlockImpl* block = built.get();
    const std::string prefix = blockPrefix(i);
    plan.layers.emplace_back(prefix + "attn.qkv.", block->attn->qkv.get());
    plan.layers.emplace_back(prefix + "attn.proj.", block->attn->proj.get());
    if (block->mlp) {
      plan.layers.emplace_back(prefix + "mlp.fc1.", block->mlp->fc1.get());
      plan.layers.emplace_back(prefix + "mlp.fc2.", block->mlp->fc2.get());
    } else {
      // The router acts on this rank's sequence shard, like the LayerNorms.
      plan.sequence_parallel_params.push_back(prefix + "moe.router.weight");
    }
    for (const char* ln : {"ln1.", "ln2."}) {
      plan.sequence_parallel_params.push_back(prefix + ln + "weight");
      plan.sequence_parallel_params.push_back(prefix + ln + "bias");
    }
  }
  if (root_->head) {
    if (root_->head->lm) plan.layers.emplace_back("head.lm.", root_->head->lm.get());
    plan.sequence_parallel_params.push_back("head.ln_f.weight");
    plan.sequence_parallel_params.push_back("head.ln_f.bias");
  }
  return plan;
}

void GptModel::setTensorParallel(TensorParallelStatePtr state) {
  if (nn::isActive(state.get())) {
    const int64_t size = state->size;
    PTRAIN_CHECK_AS(ConfigError, config_.num_heads % size == 0, "parallel.tensor_model_parallel_size: ", size,
                    " does not divide model.num_attention_heads=", config_.num_heads,
                    " (each rank needs whole heads); use a size that divides it");
    PTRAIN_CHECK_AS(ConfigError, !state->sequence_parallel || config_.seq_length % size == 0,
                    "parallel.sequence_parallel: model.seq_length=", config_.seq_length,
                    " is not divisible by parallel.tensor_model_parallel_size=", size, "; use model.seq_length=",
                    (config_.seq_length + size - 1) / size * size);
  }
  if (root_->embed) root_->embed->setTensorParallel(state);
  for (auto& [i, block] : root_->built) block->setTensorParallel(state);
  tp_ = std::move(state);
}

std::vector<std::pair<std::string, nn::MoeLayerImpl*>> GptModel::moeLayers() {
  std::vector<std::pair<std::string, nn::MoeLayerImpl*>> out;
  for (auto& [i, block] : root_->built) {
    if (block->moe) out.emplace_back(blockPrefix(i) + "moe.", block->moe.get());
  }
  return out;
}

at::Tensor GptModel::logits(const at::Tensor& tokens) {
  Batch b;
  b.tensors.emplace("tokens", tokens);
  at::Tensor hidden = forwardHidden(b);
  return holdsHead() ? root_->head(hidden) : at::Tensor();
}

at::Tensor GptModel::decodeLogits(const at::Tensor& tokens, const at::Tensor& starts, KvCache& cache) {
  PTRAIN_CHECK(root_->embed && root_->head && static_cast<int>(root_->built.size()) == numBlocks(),
               "gpt: decodeLogits needs the whole model on this rank (no pipeline split)");
  PTRAIN_CHECK(!sequenceParallel(tp_), "gpt: decodeLogits runs without sequence parallelism (its steps are one "
               "token long); decode on a layout with sequence_parallel off");
  PTRAIN_CHECK(tokens.dim() == 2 && starts.dim() == 1 && starts.size(0) == tokens.size(0),
               "gpt: decodeLogits takes tokens [B, t] and starts [B], got ", tokens.sizes(), " and ", starts.sizes());
  torch::NoGradGuard noGrad;
  const at::Tensor positions = starts.to(tokens.device(), torch::kInt64);
  PTRAIN_CHECK((positions + tokens.size(1)).max().item<int64_t>() <= config_.seq_length,
               "gpt: decoding past model.seq_length=", config_.seq_length);
  at::Tensor hidden = root_->embed->forwardAt(tokens, positions);
  if (cache.keys.empty()) {
    const int64_t heads = root_->built.begin()->second->attn->qkv->weight.size(0) / (3 * config_.headDim());
    for (int b = 0; b < numBlocks(); ++b) {
      cache.keys.push_back(torch::zeros({tokens.size(0), heads, config_.seq_length, config_.headDim()},
                                        hidden.options()));
      cache.values.push_back(torch::zeros_like(cache.keys.back()));
    }
  }
  PTRAIN_CHECK(cache.keys.front().size(0) == tokens.size(0), "gpt: a KV cache of ", cache.keys.front().size(0),
               " rows used for ", tokens.size(0));
  for (auto& [index, block] : root_->built) {
    hidden = block->forwardCached(hidden, positions, cache.keys[static_cast<size_t>(index)],
                                  cache.values[static_cast<size_t>(index)]);
  }
  return root_->head(hidden);
}

std::vector<std::vector<int64_t>> GptModel::greedyDecode(const std::vector<std::vector<int64_t>>& prompts,
                                                         int64_t maxNew, int64_t stopId, int64_t padId) {
  torch::NoGradGuard noGrad;
  const int64_t rows = static_cast<int64_t>(prompts.size());
  std::vector<std::vector<int64_t>> generated(prompts.size());
  // With a forward_sync group every rank runs the same forward passes, even one with no prompts.
  if (maxNew <= 0 || (rows == 0 && !forward_sync)) return generated;

  const int64_t capacity = config_.seq_length;
  const at::Device device = this->device();
  at::Tensor buffer = torch::full({rows, capacity}, padId, torch::kInt64);
  std::vector<int64_t> length(prompts.size());
  std::vector<char> active(prompts.size(), 1);
  {
    int64_t* buf = buffer.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const auto& p = prompts[static_cast<size_t>(r)];
      PTRAIN_CHECK(!p.empty(), "gpt: greedyDecode got an empty prompt (row ", r, ")");
      PTRAIN_CHECK(static_cast<int64_t>(p.size()) <= capacity, "gpt: prompt of row ", r, " has ", p.size(),
                   " tokens, more than model.seq_length=", capacity);
      std::copy(p.begin(), p.end(), buf + r * capacity);
      length[static_cast<size_t>(r)] = static_cast<int64_t>(p.size());
    }
  }

  for (int64_t step = 0; step < maxNew; ++step) {
    // Only the rows still decoding, and only as many positions as the longest of them.
    std::vector<int64_t> rowsNow;
    int64_t width = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (!active[static_cast<size_t>(r)]) continue;
      rowsNow.push_back(r);
      width = std::max(width, length[static_cast<size_t>(r)]);
    }
    bool anyActive = !rowsNow.empty();
    if (forward_sync) {
      // Under expert parallelism every forward pass exchanges tokens with
      // ranks decoding other prompts: stop together, and keep the others
      // company with a pass over one padding row while they finish.
      at::Tensor flag = torch::full({1}, anyActive ? 1.0 : 0.0, torch::TensorOptions(torch::kFloat64).device(device));
      AllreduceOptions opts;
      opts.op = ReduceOp::kMax;
      forward_sync->allreduce(flag, opts)->wait();
      const bool othersActive = flag.item<double>() > 0;
      if (othersActive && !anyActive) {
        Batch idle;
        idle.tensors.emplace("tokens", torch::full({1, sequenceParallel(tp_) ? tp_->size : 1}, padId,
                                                   torch::TensorOptions(torch::kInt64).device(device)));
        forwardHidden(idle);
        continue;
      }
      anyActive = othersActive;
    }
    if (!anyActive) break;
    // A sequence split needs a length the group divides (seq_length does).
    if (sequenceParallel(tp_)) width = std::min(capacity, (width + tp_->size - 1) / tp_->size * tp_->size);
    at::Tensor index = torch::tensor(rowsNow, torch::kInt64);
    at::Tensor input = buffer.index_select(0, index).narrow(1, 0, width).to(device);

    Batch b;
    b.tensors.emplace("tokens", input);
    at::Tensor hidden = forwardHidden(b);
    at::Tensor next = torch::empty({static_cast<int64_t>(rowsNow.size())}, torch::kInt64);
    if (holdsHead()) {
      // Causality makes the padding after a shorter row's end irrelevant to its
      // last position; read each row's logits there. The head runs on the whole
      // width, as in training, so sequence and vocabulary splits work unchanged.
      std::vector<int64_t> lastPos;
      lastPos.reserve(rowsNow.size());
      for (int64_t r : rowsNow) lastPos.push_back(length[static_cast<size_t>(r)] - 1);
      at::Tensor pos = torch::tensor(lastPos, torch::kInt64).to(device);
      at::Tensor rowIdx =
          torch::arange(static_cast<int64_t>(rowsNow.size()), torch::TensorOptions(torch::kInt64).device(device));
      at::Tensor last = root_->head(hidden).index({rowIdx, pos});  // [rows, V (/ tp)]
      next = nn::vocabParallelArgmax(last, config_.validVocab(), tp_.get()).to(torch::kCPU, torch::kInt64).contiguous();
    }
    // Pipeline stages without the head take the tokens the last stage picked.
    shareFromHead(next);
    const int64_t* nextPtr = next.data_ptr<int64_t>();

    int64_t* buf = buffer.data_ptr<int64_t>();
    for (size_t j = 0; j < rowsNow.size(); ++j) {
      const size_t r = static_cast<size_t>(rowsNow[j]);
      const int64_t token = nextPtr[j];
      generated[r].push_back(token);
      if (token == stopId) {
        active[r] = 0;
      } else if (length[r] < capacity) {
        buf[static_cast<int64_t>(r) * capacity + length[r]] = token;
        ++length[r];
      } else {
        active[r] = 0;  // no position left to feed this token back in
      }
    }
  }
  return generated;
}

int64_t GptModel::numParameters() const {
  int64_t total = 0;
  for (const auto& p : root_->parameters()) total += p.numel();
  return total;
}

}  // namespace ptrain::llm

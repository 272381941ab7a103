// The recommender of the `recommender` trainer as a StagedModel: DLRM
// (embedding tables, a bottom MLP over the dense features, pairwise dot
// products) with a sequence part (DIN-style target attention over the user's
// item history) and a mixture of experts before the top MLP.
//
//   embed:   the 26 sparse ids and the history through nn::EmbeddingTables
//            (one all-reduce under tensor parallelism for all 27 lookups);
//            bottom MLP 13 -> bottom_mlp... -> dim (ReLU after each layer);
//            interaction: the dot products of every pair among 29 vectors
//            (bottom output, the 26 embeddings, the history's mean, and a
//            learned vector u), with the bottom output in front:
//            [B, dim + 406]. The dots <e, u> are a learned first-order term
//            per id (FM's linear part), which the ground truth of
//            datasets/clicks has and plain DLRM can reach only through the
//            bottom output. Then everything the
//            blocks need is packed into one tensor (RecsysPacking).
//   block 0: target attention: score_h = MLP([e_h, e_t, e_h * e_t]) for each
//            history item h (e_t the target item's embedding), softmax over
//            the valid slots (history_mask), a = sum_h w_h e_h -> the packed
//            "attention" slot.
//   block 1: x = ReLU(W [interaction, a, a * e_t, e_category, e_interest]),
//            the MoE layer's input (the router sees the item category's and
//            the user interest's embeddings in it), y = x + MoE(x) (or a dense
//            GELU MLP when num_experts is 0) -> the packed "experts" slot.
//            Under tensor parallelism the samples are split over the tensor
//            group around the MoE layer (sequence parallelism's scatter and
//            gather on the batch dimension), so each expert sees each sample
//            once and the ranks' expert gradients add up to one rank's.
//   head:    top MLP h -> top_mlp... (ReLU) -> 1 logit; loss = the sum of
//            BCE-with-logits over the micro-batch, count = its samples.
//
// Pipeline: the hidden passed between stages is one [B, P] tensor
// (RecsysPacking) that keeps its shape through both blocks, so the stages
// may be cut anywhere; parallel.pipeline_layout [0, 2] gives the seed's
// split (stage 1 = tables + bottom MLP + interaction, stage 2 = attention +
// experts + top MLP).
//
// Parameter names: embed.tables.{row_wise.<table>,table_wise},
// embed.bottom.<i>.{weight,bias}, embed.first_order [1, dim], blocks.0.attn.{fc1,fc2}.{weight,bias},
// blocks.1.proj.{weight,bias}, blocks.1.moe.{router.weight,experts.*} (or
// blocks.1.ffn.{fc1,fc2}.*), head.top.<i>.{weight,bias}, head.out.{weight,bias}.
//
// Initialisation: the tables as nn::EmbeddingTables draws them (uniform in
// +-sqrt(1 / rows), per row from the table's seed); every other weight from a
// generator of its own (parameterSeed(base seed, name)), normal with
// std sqrt(2 / (fan_in + fan_out)) (DLRM's), biases 0. The base seed is one
// draw of torch's default generator, so equal seeds give equal models and a
// pipeline stage builds the values the whole model has.
//
// Thread-safety: one thread at a time (torch modules).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include "ptrain/engine/batch.h"
#include "ptrain/engine/model.h"
#include "ptrain/nn/embedding_tables.h"
#include "ptrain/nn/moe.h"

namespace ptrain::recommender {

inline constexpr int64_t kSparseFeatures = 26;
inline constexpr int64_t kDenseFeatures = 13;
// Vectors entering the interaction: bottom output, 26 embeddings, history
// mean, the learned first-order vector.
inline constexpr int64_t kInteractionVectors = kSparseFeatures + 3;

struct RecsysConfig {
  std::vector<int64_t> table_sizes;  // 26 rows counts
  int64_t dim = 16;                  // embedding width (and the bottom MLP's output)
  std::vector<int64_t> bottom_mlp{64};      // hidden widths; a last layer to dim follows
  std::vector<int64_t> top_mlp{64, 32};     // hidden widths; a last layer to 1 follows
  int64_t attention_hidden = 32;     // the attention unit's hidden width
  int64_t hidden = 64;               // width of the MoE layer's tokens (model.hidden_size)
  int64_t ffn = 128;                 // each expert's MLP width (model.ffn_hidden_size)
  int64_t history_length = 8;        // H
  int64_t item_feature = 1, category_feature = 2, interest_feature = 3;
  int64_t num_experts = 4;           // 0: a dense MLP in block 1
  nn::MoeConfig moe;                 // routing settings (sizes filled by the model)
  // nn::EmbeddingTables placement.
  int64_t row_wise_threshold = 20000;
  int64_t table_wise_slots = 8;
  int64_t row_multiple = 8;

  nn::EmbeddingTablesOptions tableOptions(uint64_t seed) const;
  // Parameters of the dense parts (everything but the tables), by part.
  int64_t bottomParameters() const;
  int64_t attentionParameters() const;
  int64_t expertBlockParameters(bool expertsOnly = false) const;  // block 1 (or just its experts)
  int64_t topParameters() const;
  // Multiply-adds of one sample's forward pass: the bottom MLP, the
  // interaction's V(V-1)/2 dot products of width dim (the pairs, not the
  // whole Gram matrix pairwiseDots multiplies out), the attention unit's MLP
  // over each of the history_length slots and its weighted sum of the slots,
  // block 1's projection, the router and the top-k experts' MLPs (the experts
  // a sample is routed to, not all of them; capacity drops not subtracted;
  // the dense MLP when num_experts is 0), and the top MLP. Embedding lookups,
  // the activations, softmaxes, elementwise products and the experts'
  // weighting of their outputs are not counted. RecommenderTrainer::trainFlops
  // is 6 x this per sample.
  int64_t forwardMultiplyAdds() const;
};

// Where each part lives in the packed hidden [B, P] (column offsets).
struct RecsysPacking {
  explicit RecsysPacking(const RecsysConfig& config);
  int64_t interaction = 0, interaction_size = 0;  // [bottom output, 406 dots]
  int64_t target = 0, category = 0, interest = 0;  // dim each
  int64_t history = 0;                             // H * dim, slot-major
  int64_t mask = 0;                                // H
  int64_t attention = 0;                           // dim (block 0 writes it)
  int64_t experts = 0;                             // hidden (block 1 writes it)
  int64_t width = 0;                               // P
  int64_t dim = 0, history_length = 0, hidden = 0;
};

// DLRM's interaction of `vectors` [B, V, d]: the dot products of pairs
// (i, j), i < j, in row-major order of the upper triangle: [B, V(V-1)/2].
at::Tensor pairwiseDots(const at::Tensor& vectors);

class RecsysModuleImpl : public torch::nn::Module {
 public:
  RecsysModuleImpl(const RecsysConfig& config, const ModelBuild& build, uint64_t baseSeed);

  std::shared_ptr<torch::nn::Module> embed, blocks, head;
  nn::EmbeddingTables tables{nullptr};
  torch::nn::Sequential bottom{nullptr};
  at::Tensor first_order;  // [1, dim]: u of the interaction
  std::shared_ptr<torch::nn::Module> attn;  // block 0: fc1, fc2
  torch::nn::Linear attn_fc1{nullptr}, attn_fc2{nullptr};
  std::shared_ptr<torch::nn::Module> mix;  // block 1: proj, moe or ffn
  torch::nn::Linear proj{nullptr};
  nn::MoeLayer moe{nullptr};
  torch::nn::Linear ffn_fc1{nullptr}, ffn_fc2{nullptr};
  torch::nn::Sequential top{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(RecsysModule);

class RecsysModel : public StagedModel {
 public:
  explicit RecsysModel(const RecsysConfig& config, const ModelBuild& build = {});
  ~RecsysModel() override;

  torch::nn::Module& module() override;
  int numBlocks() const override { return 2; }
  int64_t blockCost(int index) override;
  std::string blockPrefix(int index) const override;
  std::vector<std::string> embedPrefixes() const override;
  std::vector<std::string> headPrefixes() const override;

  // micro: "sparse" [B, 26] int64, "dense" [B, 13], "history" [B, H] int64
  // (-1 padding), "history_mask" [B, H] -> the packed hidden [B, P].
  at::Tensor embed(const Batch& micro) override;
  at::Tensor runBlock(int index, const at::Tensor& hidden) override;
  // Sum of BCE-with-logits against micro["labels"]; count = samples.
  LossOutput head(const at::Tensor& hidden, const Batch& micro) override;
  // The click logits [B] (float32) of the last block's output.
  at::Tensor logits(const at::Tensor& hidden);

  TensorParallelPlan tensorParallelPlan() override;
  void setTensorParallel(std::shared_ptr<const nn::TensorParallelState> state) override;
  int64_t numExperts() const override { return config_.num_experts; }
  std::vector<std::pair<std::string, nn::MoeLayerImpl*>> moeLayers() override;

  // The tables' own values (nn::EmbeddingTables), zero biases, and every
  // other weight normal with Xavier's std sqrt(2 / (fan_in + fan_out)) of
  // its whole shape, from the parameter's own stream.
  std::optional<nn::ParameterInit> parameterInit(const std::string& name,
                                                 const std::vector<int64_t>& fullSizes) const override;

  const RecsysConfig& config() const { return config_; }
  const RecsysPacking& packing() const { return packing_; }
  // The tensor-parallel size the model runs at (1 without the plugin).
  int tpSize() const;

 private:
  at::Tensor attention(const at::Tensor& hidden);
  at::Tensor mixture(const at::Tensor& hidden);

  RecsysConfig config_;
  RecsysPacking packing_;
  uint64_t base_seed_ = 0;
  RecsysModule root_{nullptr};
  std::shared_ptr<const nn::TensorParallelState> tp_;
};

}  // namespace ptrain::recommender

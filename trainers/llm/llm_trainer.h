// LlmTrainer: the `llm` trainer plugin. A GPT decoder (gpt_model.h) learns
// arithmetic from the character-level problems of
// ptrain/datasets/arithmetic.h; its metric is the exact match of greedy
// decoding on held-out problems.
//
// With data.name: megatron it trains on Megatron's indexed data sets instead
// (token_corpus.h; data.path, data.split), and its metric is eval_loss on the
// validation split. With data.name: prompts it learns a user's own problems
// (prompt_set.h; data.path, data.validation_path, data.shuffle), scored as
// the arithmetic problems are.
//
// Keys it reads (docs/trainers/llm.md): model.num_layers, hidden_size,
// num_attention_heads (required), ffn_hidden_size, seq_length (not set: the
// shortest that fits every problem), vocab_size (0: the dataset's 16),
// make_vocab_size_divisible_by (its own key: the embedding pads the vocabulary
// to a multiple of it, 128 by default), dropout, init_std, tie_embeddings;
// data.operations, data.digits, data.eval_size; train.seed seeds the problem
// streams; parallel.tensor_model_parallel_size and sequence_parallel for the
// checks below.
//
// Thread-safety: one thread at a time, like every trainer.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpt_model.h"
#include "prompt_set.h"
#include "token_corpus.h"
#include "ptrain/datasets/arithmetic.h"
#include "ptrain/engine/model_trainer.h"

namespace ptrain::llm {

class LlmTrainer : public ModelTrainer<GptModel> {
 public:
  explicit LlmTrainer(const PluginContext& context);
  ~LlmTrainer() override;

  void describeKeys(Schema& schema) const override;
  // Throws ConfigError (via recipe.fail, naming the key) for a missing model
  // size, an unknown operation or dataset, a vocabulary smaller than the
  // dataset's, a hidden size that the heads do not divide, a sequence too short
  // for the longest problem, MoE keys this dense model does not have, a padded
  // vocabulary that tensor_model_parallel_size does not divide, or (with
  // sequence_parallel) a seq_length it does not divide.
  void setup(const Recipe& recipe) override;
  Batch globalBatch(int64_t step, int64_t globalBatchSize) override;
  Batch batchRows(int64_t step, int64_t globalBatchSize, int64_t begin, int64_t end) override;
  // Answer tokens (incl. EOS) in the batch: the loss is their mean.
  double lossCount(const Batch& batch) const override;
  // Input tokens: rows * seq_length.
  double tokensIn(const Batch& batch) const override;
  // Megatron's count: 6 * (matmul parameters, LM head included) per token
  // for forward + backward, plus 12 * layers * hidden * seq_length per token
  // for the attention scores and their use (QK^T and PV, forward + backward).
  double trainFlops(double tokens) const override;
  std::optional<plan::ModelShape> modelShape() const override;
  // model.seq_length taken from the longest prompt file line, when the recipe sets none.
  std::vector<std::string> derivedSizes() const override { return derived_sizes_; }
  // A Hugging Face GPT-2 folder (hf_gpt2.h) under this model's names.
  std::unique_ptr<WeightsSource> openForeignWeights(const std::string& path) const override;
  // "hf": a GPT-2 folder transformers' GPT2LMHeadModel loads (hf_gpt2.h).
  std::vector<std::string> exportFormats() const override { return {"hf"}; }
  void exportWeights(const std::string& format, WeightsSource& weights, const std::string& outDir) const override;
  // With data.name: megatron, the corpus's files and sample order, and the
  // samples consumed before `step` (token_corpus.h); null for arithmetic.
  nlohmann::json dataPosition(int64_t step, int64_t globalBatchSize) const override;
  std::optional<std::string> checkDataPosition(const nlohmann::json& saved, int64_t step,
                                               int64_t globalBatchSize) const override;

  // Valid after setup().
  const GptConfig& modelConfig() const { return config_; }
  const datasets::ArithmeticDataset& dataset() const { return *dataset_; }
  // The files' corpus with data.name: megatron; null otherwise.
  const TokenCorpus* corpus() const { return corpus_.get(); }
  // The user's problems with data.name: prompts (training, validation); null otherwise.
  const PromptSet* prompts() const { return prompts_.get(); }
  const PromptSet* validationPrompts() const { return validation_prompts_.get(); }
  // Training problem `index` (step * batch + row) with data.name: prompts.
  const PromptAnswer& trainPrompt(int64_t index) const;
  // What evaluate() scores: the arithmetic evaluation problems, or the
  // validation prompts (none without data.validation_path).
  std::vector<PromptAnswer> evalItems() const;

 protected:
  std::shared_ptr<GptModel> makeModel(const ModelBuild& build) override;
  // eval_exact_match: the fraction of this run's evaluation problems whose
  // greedy decoding equals the answer followed by EOS; eval_loss: mean
  // cross-entropy per answer token on the same problems. Each data-parallel
  // rank takes a contiguous shard; the counts are summed with one
  // ctx.all_reduce_sum. Runs under NoGradGuard; the engine sets eval mode.
  std::map<std::string, double> evaluateModel(GptModel& gpt, const EvalContext& ctx) override;

 private:
  // data.name: megatron (after the model keys).
  void setupCorpus(const Recipe& recipe, GptConfig& config);
  // eval_loss over the validation split's first data.eval_size samples.
  std::map<std::string, double> evaluateCorpus(GptModel& gpt, const EvalContext& ctx);

  GptConfig config_;
  std::optional<datasets::ArithmeticDataset> dataset_;
  std::unique_ptr<TokenCorpus> corpus_;
  std::unique_ptr<PromptSet> prompts_;
  std::unique_ptr<PromptSet> validation_prompts_;
  std::vector<std::string> derived_sizes_;  // derivedSizes()
  bool shuffle_prompts_ = true;
  uint64_t seed_ = 0;
};

}  // namespace ptrain::llm

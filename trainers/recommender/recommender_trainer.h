// RecommenderTrainer: the `recommender` trainer plugin. A DLRM-style click
// model with target attention and experts (recsys_model.h) learns the
// synthetic click logs of ptrain/datasets/clicks.h, whose hidden ground-truth
// model gives the best AUC attainable; evaluation reports the model's AUC and
// logloss on the validation set beside that best.
//
// Keys it reads (docs/trainers/recommender.md): model.embedding_dim,
// model.bottom_mlp, model.top_mlp, model.attention_hidden, model.hidden_size
// (the experts' token width), model.ffn_hidden_size (each expert's width;
// 0: 2 * hidden_size), model.num_experts and the model.moe_* routing keys,
// model.scale and model.min_table_rows (the tables' sizes scaled),
// model.row_wise_threshold, model.table_wise_slots, model.row_multiple (the
// tables' sharding), model.embedding_optimizer, model.embedding_lr,
// model.embedding_weight_decay (the tables' sparse optimizer); data.table_sizes,
// data.history_length, data.min_history, data.zipf_exponent, data.logit_std,
// data.click_rate, data.world_seed, data.eval_size; train.seed seeds the
// training samples.
//
// Data from files (data.name: criteo, click_files.h): data.path, the training
// TSV (plain or .gz), data.validation_path, data.shuffle, data.shuffle_block;
// the tables, history length and eval_size as above. The generator's
// keys are refused there, the files' keys with the generator. The files'
// index (FILE.ptrain-index) is built by the first setup() that opens them:
// `ptrain run` sets the recipe up once in the launcher before it starts the
// workers (and `ptrain check` does the same), so the workers load a finished
// index; workers started by another launcher may each build it, which
// CriteoDataset makes safe (each renames a whole, equal file into place).
//
// Thread-safety: one thread at a time, like every trainer.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "click_files.h"
#include "ptrain/datasets/clicks.h"
#include "ptrain/engine/model_trainer.h"
#include "recsys_model.h"

namespace ptrain::recommender {

// What one rank of a layout holds, for `ptrain check` and the logs.
struct RecsysFootprint {
  int64_t total_parameters = 0;      // the whole model
  int64_t table_parameters = 0;      // the tables, padding included
  int64_t first_stage_parameters = 0;  // per rank of the stage holding the tables
  int64_t last_stage_parameters = 0;   // per rank of the stage holding the head (== first when pp = 1)
  double first_stage_bytes = 0;      // parameters, gradients, optimizer state
  double last_stage_bytes = 0;
};

class RecommenderTrainer : public ModelTrainer<RecsysModel> {
 public:
  explicit RecommenderTrainer(const PluginContext& context);
  ~RecommenderTrainer() override;

  void describeKeys(Schema& schema) const override;
  // Throws ConfigError (via recipe.fail, naming the key) for another data set,
  // keys of the transformer trainers, sizes that cannot work, and layouts the
  // model cannot take (tables tp does not split, a micro-batch tp does not
  // divide under experts). Logs the parameters and bytes per rank (rank 0).
  void setup(const Recipe& recipe) override;
  // Training samples step * size .. step * size + size - 1 (ClicksDataset::batch).
  Batch globalBatch(int64_t step, int64_t globalBatchSize) override;
  Batch batchRows(int64_t step, int64_t globalBatchSize, int64_t begin, int64_t end) override;
  double tokensIn(const Batch& batch) const override;  // samples
  const char* throughputUnit() const override { return "samples"; }
  // Model FLOPs of training on `samples` samples: 6 x
  // RecsysConfig::forwardMultiplyAdds per sample (0 before setup()).
  double trainFlops(double samples) const override;
  // The engine's loop over one runtime, with the tables' sparse optimizer
  // (model.embedding_optimizer) set on its options.
  TrainSummary train(TrainingSession& session) override;

  // {"clicks"}: the generator's samples as Criteo TSV (with ptrain's history
  // columns), which data.name: criteo with data.shuffle: false reads back as
  // the same batches. exportData writes training samples 0..train-1 to `out`
  // (gzip when it ends in .gz) and validation samples 0..validation-1 to
  // validationPathFor(out) (0: train.steps x global_batch_size, data.eval_size),
  // prints one line with the counts and bytes, and refuses (ConfigError) an
  // existing file, a recipe that reads files, and another name.
  std::vector<std::string> exportableData() const override { return {"clicks"}; }
  void exportData(const std::string& name, const std::string& out, int64_t train, int64_t validation) const override;
  // Files only (null for the generator): ClickFiles::position / differs.
  nlohmann::json dataPosition(int64_t step, int64_t globalBatchSize) const override;
  std::optional<std::string> checkDataPosition(const nlohmann::json& saved, int64_t step,
                                               int64_t globalBatchSize) const override;
  // The files of data.name: criteo, or null for the generator.
  const ClickFiles* files() const { return files_.get(); }

  const RecsysConfig& modelConfig() const { return config_; }
  // The generator; setup() with data.name: clicks first.
  const datasets::ClicksDataset& dataset() const { return *dataset_; }
  const RecsysFootprint& footprint() const { return footprint_; }
  // The planner's memory per rank of a stage (recsysStageMemory).
  std::optional<plan::MemoryEstimate> stageMemory(const plan::Layout& layout, int64_t stage) const override;
  const datasets::ClicksBestScores& bestScores();

 protected:
  std::shared_ptr<RecsysModel> makeModel(const ModelBuild& build) override;
  // eval_auc and eval_logloss of the click probabilities on validation
  // samples 0..eval_size-1 (every data-parallel shard's probabilities summed
  // into one tensor, so every rank scores all of them exactly), eval_loss (the
  // mean BCE), and best_auc / best_logloss: the hidden model's on the same
  // samples; with data.term_fit, fit_<term> and fit_r2 (fitTerms).
  std::map<std::string, double> evaluateModel(RecsysModel& net, const EvalContext& ctx) override;

 private:
  // data.term_fit: the coefficients of the model's validation logits on the
  // hidden model's terms (fit_<term>) and the fit's R^2 (fit_r2), into `out`.
  void fitTerms(const at::Tensor& probabilities, std::map<std::string, double>& out);

  int rank_ = 0;
  RecsysConfig config_;
  std::unique_ptr<datasets::ClicksDataset> dataset_;  // data.name: clicks
  std::unique_ptr<ClickFiles> files_;                 // data.name: criteo
  int64_t default_export_samples_ = 0;                // train.steps x global_batch_size
  std::optional<datasets::ClicksBestScores> best_;
  int64_t eval_size_ = 0;
  bool term_fit_ = false;                   // data.term_fit
  std::vector<double> term_contributions_;  // [eval_size x kClicksTerms], made at the first fit
  std::string embedding_optimizer_ = "rowwise_adagrad";
  double embedding_lr_ = 0;
  double embedding_weight_decay_ = 0;
  RecsysFootprint footprint_;
  std::vector<int64_t> pipeline_layout_;  // parallel.pipeline_layout, empty when unset
};

// The footprint of `config` at tp x pp x ep (etp 1), fp32 parameters and
// gradients, AdamW's two moments for the dense parameters and, for the
// tables, the sparse optimizer's state ("rowwise_adagrad": a float per row;
// "sparse_adam" or "none": two per value).
// What one rank of pipeline stage `stage` holds at `layout` (the planner's
// terms, without the device's reserved memory): its share of the tables
// (float32, and their dense gradient, which backward makes whole for the
// rank's rows) and the table optimizer's state; its stage's dense parameters
// (experts divided by ep) with gradients and AdamW's moments (every gradient
// twice with several micro-batches a step: each micro-batch's is made whole
// before it is added in); the activations of the micro-batches
// in flight and of an evaluation chunk (of `evalSize` samples over dp); the
// data plugin's buffers for the gradients it all-reduces.
plan::MemoryEstimate recsysStageMemory(const RecsysConfig& config, const plan::Layout& layout,
                                       const std::string& tableOptimizer, const std::vector<int64_t>& pipelineLayout,
                                       int64_t evalSize, int64_t stage);
RecsysFootprint recsysFootprint(const RecsysConfig& config, int tp, int pp, int ep, const std::string& tableOptimizer,
                                const std::vector<int64_t>& pipelineLayout);

}  // namespace ptrain::recommender

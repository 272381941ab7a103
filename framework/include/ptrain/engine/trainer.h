// Trainer: the interface of a `trainer` plugin. A trainer owns one task: its
// recipe keys (model.*, data.*), its data, its model and its evaluation metric.
// The engine owns everything else (parallelism, precision, optimizer, loop,
// checkpoints, metrics). A trainer whose task is not "one model, batches that
// are a pure function of the step" (reinforcement learning with several
// models, say) overrides train() and drives runtimes itself.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ptrain/engine/batch.h"
#include "ptrain/engine/model.h"
#include "ptrain/layout/model_shape.h"
#include "ptrain/plugin/plugin.h"
#include "ptrain/recipe/schema.h"

namespace ptrain {

class Recipe;

// What evaluation may use: its shard of the evaluation set, and a sum across
// the data-parallel ranks (every rank of the group must call it equally often).
struct EvalContext {
  int shard = 0;
  int num_shards = 1;
  std::function<void(at::Tensor&)> all_reduce_sum;
  at::Device device{at::kCPU};  // where the model computes (and sums live)
};

class TrainingSession;
class WeightsSource;
struct TrainSummary;

class PTRAIN_API Trainer : public Plugin {
 public:
  ~Trainer() override;
  const char* kind() const final { return plugin_kind::kTrainer; }

  // Adds the trainer's keys (model.*, data.* beyond the core ones).
  virtual void describeKeys(Schema& schema) const = 0;
  // Reads its keys from the validated recipe and prepares the data. Throws
  // ConfigError (via recipe.fail) for values that are valid alone but not
  // together (e.g. a sequence too short for the problems).
  virtual void setup(const Recipe& recipe) = 0;
  // A new model with freshly initialised weights, holding the parts `build`
  // names (every part by default; an outline holds none). The engine seeds
  // torch's generator first, so equal seeds give equal weights; every
  // parameter must draw from a stream of its own (seeded from the generator
  // and its name), so a part starts from the same values whichever other
  // parts are built.
  virtual std::shared_ptr<StagedModel> buildModel(const ModelBuild& build = {}) = 0;
  // The global batch of `step` (0-based): a pure function of the seed, the
  // step and the size, so every layout sees the same rows.
  virtual Batch globalBatch(int64_t step, int64_t globalBatchSize) = 0;
  // Rows [begin, end) of that global batch: what one data-parallel rank
  // consumes each step (the default loop asks for nothing else). The same
  // rows globalBatch(step, size).slice(begin, end) holds; the default builds
  // the global batch and takes them, a trainer whose data can make a range of
  // rows alone overrides it, so that no rank builds the whole global batch.
  virtual Batch batchRows(int64_t step, int64_t globalBatchSize, int64_t begin, int64_t end);
  // Items the loss of `batch` sums over (e.g. answer tokens): the engine
  // divides every micro-batch's loss_sum by this count for the whole global
  // batch, summed over the data-parallel ranks' rows, so it must add up over
  // rows. Default: one per row.
  virtual double lossCount(const Batch& batch) const { return static_cast<double>(batch.size()); }
  // Tokens (or samples) in a batch, for throughput figures.
  virtual double tokensIn(const Batch& batch) const = 0;
  // What tokensIn counts, plural ("tokens", "samples", "images"): the unit of
  // the progress line's and the run summary's throughput.
  virtual const char* throughputUnit() const { return "tokens"; }
  // Model FLOPs of training on `items` of throughputUnit() (forward and
  // backward; recomputation and padding not counted), for MFU on the progress
  // line and in metrics.jsonl (docs/monitoring.md); 0: not counted, no MFU.
  virtual double trainFlops(double items) const { return 0; }
  // After setup: the model's shape for the layout checks and the planner's
  // cost model (`ptrain check`, `ptrain plan`; layout/model_shape.h); nullopt for a model it cannot size.
  virtual std::optional<plan::ModelShape> modelShape() const { return std::nullopt; }
  // After setup: each size the trainer took from the data instead of the
  // recipe, with where it came from and the key that bounds it, e.g.
  // "model.seq_length 600001 comes from the longest problem, FILE:LINE: set
  // model.seq_length to bound it". A message about what the sizes cost (a
  // memory refusal) names them, so the user sees which line made the model
  // that large.
  virtual std::vector<std::string> derivedSizes() const { return {}; }
  // After setup, for a model that is not GPT-shaped (modelShape() is
  // nullopt): what one rank of pipeline stage `stage` of `layout` holds
  // (parameters, gradients, optimizer state, activations of the micro-batches
  // in flight, communication buffers; the planner adds the device's reserved
  // memory). `ptrain plan` prints it and checks it against the device.
  // nullopt: the trainer cannot say.
  virtual std::optional<plan::MemoryEstimate> stageMemory(const plan::Layout& layout, int64_t stage) const {
    return std::nullopt;
  }
  // Metrics named eval_* (e.g. eval_exact_match in [0, 1], eval_loss).
  virtual std::map<std::string, double> evaluate(StagedModel& model, const EvalContext& ctx) = 0;

  // checkpoint.load of `path` when it is not a ptrain run or step folder and
  // not a bare safetensors file with the model's names: a folder of another
  // framework this trainer reads (the llm trainer: a Hugging Face GPT-2
  // folder), as a source under the model's parameter names. nullptr: not a
  // format this trainer reads. After setup(). Throws CheckpointError (one
  // line) for a folder of its format that does not fit the model (e.g.
  // another hidden size), naming the difference.
  virtual std::unique_ptr<WeightsSource> openForeignWeights(const std::string& path) const;
  // Formats `ptrain export --format` writes for this trainer ("hf"); empty:
  // none.
  virtual std::vector<std::string> exportFormats() const { return {}; }
  // Writes `weights` (a checkpoint of this trainer's model, set up with that
  // run's recipe) as `format` into the new folder `outDir`. Throws
  // ConfigError naming what the format cannot express (e.g. an untied head
  // or experts), CheckpointError for an unreadable checkpoint or an
  // unwritable folder. The default refuses every format.
  virtual void exportWeights(const std::string& format, WeightsSource& weights, const std::string& outDir) const;

  // Data sets `ptrain data export NAME OUT` writes as files (e.g. "mosaic":
  // the built-in mosaics as a COCO folder); empty: none.
  virtual std::vector<std::string> exportableData() const { return {}; }
  // Writes built-in data set `name` (one of exportableData(), with the
  // options setup() read from the recipe) into `out` in a format this
  // trainer also reads from files, so that training from `out` gives the
  // generator's batches. `train` / `validation`: samples of each split (0:
  // the trainer's default). Throws ConfigError for an unknown name, an
  // existing non-empty `out`, or an unwritable path. The default refuses.
  virtual void exportData(const std::string& name, const std::string& out, int64_t train, int64_t validation) const;

  // The data position a checkpoint at `step` records (meta.json "data"):
  // which files, how many samples consumed, the epoch; null for data that
  // is a pure function of the step alone (the built-in generators). Read
  // back on resume by checkDataPosition. After setup().
  virtual nlohmann::json dataPosition(int64_t step, int64_t globalBatchSize) const;
  // On resume from `step`: what is wrong continuing after `saved` (what
  // dataPosition wrote then), e.g. a data file that changed since; nullopt
  // when the run continues exactly where it stopped. The default accepts
  // anything.
  virtual std::optional<std::string> checkDataPosition(const nlohmann::json& saved, int64_t step,
                                                       int64_t globalBatchSize) const {
    return std::nullopt;
  }

  // Runs the whole training on this rank (collective over the job). The
  // default is the engine's loop over one runtime (defaultTrainingLoop in
  // engine.h): globalBatch per step, evaluation, checkpoints, metrics.
  virtual TrainSummary train(TrainingSession& session);
};

}  // namespace ptrain

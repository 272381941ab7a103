// trainer/regression: a residual MLP (regression_model.h) learns a fixed
// smooth function of its inputs, on data it makes itself.
//
// Data: sample r of a split has inputs x_r ~ N(0, 1)^features, row r of an
// endless [2^40, features] tensor drawn counter by counter from the split's
// own stream (nn::drawParameter over ParameterInit::normal, seeded by
// train.seed and the split's name), and targets y_r = sin(A x_r) [outputs],
// A a hidden [outputs, features] matrix with entries N(0, 4 / features) from
// a stream of its own. Row i of step s's global batch is training sample
// s * global_batch_size + i: a pure function of (seed, step, row), so a
// data-parallel rank makes its own rows alone and every layout trains on the
// same samples.
//
// Keys: model.num_layers, model.hidden_size, model.recompute(_num_layers),
// data.features, data.outputs, data.eval_size; train.seed seeds the data.
// Metric: eval_loss, the mean squared error on evaluation samples
// 0..eval_size-1.
//
// Thread-safety: one thread at a time, like every trainer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "ptrain/core/error.h"
#include "ptrain/engine/batch.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/model_trainer.h"
#include "ptrain/nn/parameter_init.h"
#include "ptrain/nn/parameter_seed.h"
#include "ptrain/plugin/plugin.h"
#include "ptrain/recipe/key_specs.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"
#include "regression_model.h"

namespace regression {

namespace {

// Rows of each split's input stream: far more than any run reads.
constexpr int64_t kStreamRows = int64_t{1} << 40;
// Most inputs per sample (kStreamRows x features positions fit a uint64 counter).
constexpr int64_t kMaxFeatures = 1 << 20;

}  // namespace

class RegressionTrainer final : public ptrain::ModelTrainer<RegressionModel> {
 public:
  explicit RegressionTrainer(const ptrain::PluginContext&) {}

  void describeKeys(ptrain::Schema& schema) const override {
    using ptrain::ValueType;
    using ptrain::keys::atLeast;
    using ptrain::keys::atMost;
    using ptrain::keys::key;
    schema.add(atLeast(key("model.num_layers", ValueType::kInt, "4",
                           "Residual MLP blocks; split across pipeline stages."),
                       1));
    schema.add(atLeast(key("model.hidden_size", ValueType::kInt, "64", "Width of the hidden states."), 1));
    // The engine recomputes whole blocks of any StagedModel.
    ptrain::keys::addRecompute(schema, /*selective=*/false);
    schema.add(atMost(atLeast(key("data.features", ValueType::kInt, "16", "Inputs per sample."), 1),
                      static_cast<double>(kMaxFeatures)));
    schema.add(atLeast(key("data.outputs", ValueType::kInt, "4", "Targets per sample: sin of that many hidden "
                                                                  "linear maps of the inputs."),
                       1));
    schema.add(atLeast(key("data.eval_size", ValueType::kInt, "512",
                           "Evaluation samples (0..eval_size-1, a stream of their own), split across "
                           "data-parallel ranks; 0: no evaluation."),
                       0));
  }

  void setup(const ptrain::Recipe& recipe) override {
    if (recipe.has("data.name") && !recipe.getString("data.name").empty()) {
      recipe.fail("data.name", "the regression trainer makes its own data; remove data.name");
    }
    RegressionConfig c;
    c.num_blocks = recipe.getInt("model.num_layers");
    c.hidden = recipe.getInt("model.hidden_size");
    c.features = recipe.getInt("data.features");
    c.outputs = recipe.getInt("data.outputs");
    const auto seed = static_cast<uint64_t>(recipe.getInt("train.seed"));
    // A: N(0, 4 / features), so that A x ~ N(0, 4): sin is far from linear there.
    const auto mapInit =
        ptrain::nn::ParameterInit::normal(ptrain::parameterSeed(seed, "data.map"), 0.0, 2.0 / std::sqrt(c.features));
    map_ = ptrain::nn::drawParameter(mapInit, {c.outputs, c.features}).to(torch::kFloat64);
    config_ = c;
    seed_ = seed;
    eval_size_ = recipe.getInt("data.eval_size");
    ready_ = true;
  }

  ptrain::Batch globalBatch(int64_t step, int64_t globalBatchSize) override {
    return batchRows(step, globalBatchSize, 0, globalBatchSize);
  }

  // Only rows [begin, end): no rank makes the whole global batch.
  ptrain::Batch batchRows(int64_t step, int64_t globalBatchSize, int64_t begin, int64_t end) override {
    return samples("train", step * globalBatchSize + begin, end - begin);
  }

  // The loss is a mean over every target value.
  double lossCount(const ptrain::Batch& batch) const override {
    return static_cast<double>(batch.size() * config_.outputs);
  }
  double tokensIn(const ptrain::Batch& batch) const override { return static_cast<double>(batch.size()); }
  const char* throughputUnit() const override { return "samples"; }

 protected:
  std::shared_ptr<RegressionModel> makeModel(const ptrain::ModelBuild& build) override {
    PTRAIN_CHECK(ready_, "regression trainer: buildModel() before setup()");
    return std::make_shared<RegressionModel>(config_, build);
  }

  // eval_loss: the mean squared error over evaluation samples
  // 0..eval_size-1. Each data-parallel rank takes a contiguous shard; under
  // pipeline parallelism every stage of a pipeline runs the same shard
  // through forwardHidden, the last stage (holdsHead) scores it and
  // shareFromHead gives the sums to the others; ctx.all_reduce_sum then adds
  // up the shards.
  std::map<std::string, double> evaluateModel(RegressionModel& model, const ptrain::EvalContext& ctx) override {
    PTRAIN_CHECK(ready_, "regression trainer: evaluate() before setup()");
    torch::NoGradGuard noGrad;
    if (eval_size_ == 0) return {};
    const int64_t begin = eval_size_ * ctx.shard / ctx.num_shards;
    const int64_t end = eval_size_ * (ctx.shard + 1) / ctx.num_shards;
    const auto f64 = torch::TensorOptions(torch::kFloat64).device(ctx.device);
    at::Tensor sums = torch::zeros({2}, f64);  // squared errors, target values
    if (end > begin) {
      const ptrain::Batch batch = samples("eval", begin, end - begin).to(ctx.device);
      const at::Tensor hidden = model.forwardHidden(batch);
      if (model.holdsHead()) {
        const ptrain::LossOutput loss = model.head(hidden, batch);
        sums[0] = loss.loss_sum.to(torch::kFloat64);
        sums[1] = loss.count;
      }
      model.shareFromHead(sums);
    }
    if (ctx.all_reduce_sum) ctx.all_reduce_sum(sums);
    sums = sums.cpu();
    return {{"eval_loss", sums[0].item<double>() / std::max(1.0, sums[1].item<double>())}};
  }

 private:
  // Samples first..first+count-1 of `split` ("train", "eval"): "inputs"
  // [count, features] and "targets" [count, outputs], float32.
  ptrain::Batch samples(const std::string& split, int64_t first, int64_t count) const {
    PTRAIN_CHECK(ready_, "regression trainer: batches before setup()");
    const auto init = ptrain::nn::ParameterInit::normal(ptrain::parameterSeed(seed_, "data." + split), 0.0, 1.0);
    at::Tensor x = ptrain::nn::drawParameter(init, {kStreamRows, config_.features}, {first, 0},
                                             {count, config_.features});
    // A x in float64 as a sum over each row's own products (no matrix
    // product whose blocking could depend on how many rows a rank makes),
    // then rounded: a row's targets depend on that row alone.
    at::Tensor ax = (x.to(torch::kFloat64).unsqueeze(1) * map_.unsqueeze(0)).sum(2);
    at::Tensor y = torch::sin(ax).to(torch::kFloat32);
    ptrain::Batch batch;
    batch.tensors["inputs"] = x;
    batch.tensors["targets"] = y;
    return batch;
  }

  RegressionConfig config_;
  at::Tensor map_;  // A [outputs, features], float64
  uint64_t seed_ = 0;
  int64_t eval_size_ = 0;
  bool ready_ = false;
};

}  // namespace regression

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kTrainer, "regression", "0.1.0", regression::RegressionTrainer)

// RegressionModel: the `regression` trainer's model as a StagedModel, a stack
// of residual MLP blocks that a pipeline can split anywhere.
//
//   embed:  x [B, features] -> embed.input (Linear features -> hidden)
//   block:  h + fc2(gelu(fc1(norm(h))))    norm: LayerNorm(hidden),
//           fc1: Linear hidden -> 2 hidden, fc2: Linear 2 hidden -> hidden
//   head:   out(norm(h)) [B, outputs]; loss = the sum of squared errors over
//           the micro-batch's targets, count = its rows x outputs (so the
//           engine's division gives the mean squared error)
//
// Every block keeps the shape [B, hidden], so pipeline stages may cut the
// blocks anywhere (ModelBuild names the blocks a stage holds).
//
// Parameter names: embed.input.{weight,bias},
// blocks.<i>.{norm,fc1,fc2}.{weight,bias}, head.{norm,out}.{weight,bias}.
//
// Initialisation (parameterInit): weights normal with Xavier's std
// sqrt(2 / (fan_in + fan_out)), each from its own stream
// parameterSeed(base seed, name); biases 0; norm weights 1. The base seed is
// nn::modelSeed(): one draw of torch's default generator, which the engine
// seeds with train.seed, so every rank of every layout starts each parameter
// from the values the one-rank model gives it.
//
// Thread-safety: one thread at a time (torch modules).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "ptrain/engine/batch.h"
#include "ptrain/engine/model.h"
#include "ptrain/nn/parameter_init.h"

namespace regression {

struct RegressionConfig {
  int64_t features = 16;  // data.features: inputs per sample
  int64_t outputs = 4;    // data.outputs: targets per sample
  int64_t hidden = 64;    // model.hidden_size
  int64_t num_blocks = 4; // model.num_layers

  int64_t inner() const { return 2 * hidden; }  // width inside a block
};

// One residual block: norm, fc1, fc2.
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const RegressionConfig& c);
  at::Tensor forward(const at::Tensor& h);

  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

class RegressionModel : public ptrain::StagedModel {
 public:
  // Builds the parts `build` names and draws their parameters.
  RegressionModel(const RegressionConfig& config, const ptrain::ModelBuild& build);

  torch::nn::Module& module() override { return *root_; }
  int numBlocks() const override { return static_cast<int>(config_.num_blocks); }
  // Parameters of one block, from the shape alone (an outline builds none).
  int64_t blockCost(int index) override;
  std::string blockPrefix(int index) const override { return "blocks." + std::to_string(index) + "."; }
  std::vector<std::string> embedPrefixes() const override { return {"embed."}; }
  std::vector<std::string> headPrefixes() const override { return {"head."}; }

  // micro["inputs"] [B, features] -> [B, hidden].
  at::Tensor embed(const ptrain::Batch& micro) override;
  at::Tensor runBlock(int index, const at::Tensor& hidden) override;
  // Sum of squared errors against micro["targets"] [B, outputs].
  ptrain::LossOutput head(const at::Tensor& hidden, const ptrain::Batch& micro) override;
  // The predictions [B, outputs] (float32) of the last block's output.
  at::Tensor predict(const at::Tensor& hidden);

  std::optional<ptrain::nn::ParameterInit> parameterInit(const std::string& name,
                                                         const std::vector<int64_t>& fullSizes) const override;

 private:
  RegressionConfig config_;
  uint64_t base_seed_ = 0;
  std::shared_ptr<torch::nn::Module> root_;
  torch::nn::Linear input_{nullptr};         // embed
  std::map<int, Block> blocks_;              // the blocks this rank built
  torch::nn::LayerNorm head_norm_{nullptr};  // head
  torch::nn::Linear out_{nullptr};
};

}  // namespace regression

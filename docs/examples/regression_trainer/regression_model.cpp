#include "regression_model.h"

#include <cmath>

#include "ptrain/core/error.h"
#include "ptrain/nn/parameter_seed.h"

namespace regression {

namespace {

bool endsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

BlockImpl::BlockImpl(const RegressionConfig& c) {
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
  fc1 = register_module("fc1", torch::nn::Linear(c.hidden, c.inner()));
  fc2 = register_module("fc2", torch::nn::Linear(c.inner(), c.hidden));
}

at::Tensor BlockImpl::forward(const at::Tensor& h) { return h + fc2(torch::gelu(fc1(norm(h)))); }

RegressionModel::RegressionModel(const RegressionConfig& config, const ptrain::ModelBuild& build)
    : config_(config), root_(std::make_shared<torch::nn::Module>()) {
  const RegressionConfig& c = config_;
  // Drawn on every build, outlines included, so every rank's generator moves alike.
  base_seed_ = ptrain::nn::modelSeed();
  // Registration order is the parameter order: embed, blocks, head. Each part
  // exists only where `build` asks for it: a pipeline stage holds its blocks,
  // the first stage the embedding, the last the head.
  auto embed = root_->register_module("embed", std::make_shared<torch::nn::Module>());
  if (build.embed) input_ = embed->register_module("input", torch::nn::Linear(c.features, c.hidden));
  auto blocks = root_->register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int i = 0; i < numBlocks(); ++i) {
    if (build.buildsBlock(i)) blocks_.emplace(i, blocks->register_module(std::to_string(i), Block(c)));
  }
  auto head = root_->register_module("head", std::make_shared<torch::nn::Module>());
  if (build.head) {
    head_norm_ = head->register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
    out_ = head->register_module("out", torch::nn::Linear(c.hidden, c.outputs));
  }
  // Every parameter built here from parameterInit (torch's own initial
  // values are overwritten).
  initialiseParameters();
}

std::optional<ptrain::nn::ParameterInit> RegressionModel::parameterInit(const std::string& name,
                                                                        const std::vector<int64_t>& fullSizes) const {
  using ptrain::nn::ParameterInit;
  if (endsWith(name, ".bias")) return ParameterInit::constant(0.0);
  if (endsWith(name, "norm.weight")) return ParameterInit::constant(1.0);
  if (fullSizes.size() != 2) return std::nullopt;
  // A Linear weight [out, in]: its own stream, whatever else this rank builds.
  const double fanOut = static_cast<double>(fullSizes[0]), fanIn = static_cast<double>(fullSizes[1]);
  return ParameterInit::normal(ptrain::parameterSeed(base_seed_, name), 0.0, std::sqrt(2.0 / (fanIn + fanOut)));
}

int64_t RegressionModel::blockCost(int) {
  const int64_t h = config_.hidden, i = config_.inner();
  return 2 * h + (h * i + i) + (i * h + h);
}

at::Tensor RegressionModel::embed(const ptrain::Batch& micro) {
  PTRAIN_CHECK(input_, "regression: embed() on a rank that did not build the embedding");
  const at::Tensor& x = micro.at("inputs");
  PTRAIN_CHECK(x.dim() == 2 && x.size(1) == config_.features, "regression: inputs must be [B, ", config_.features,
               "], got ", x.sizes());
  // In the model's dtype (a precision plugin may have cast it).
  return input_(x.to(input_->weight.scalar_type()));
}

at::Tensor RegressionModel::runBlock(int index, const at::Tensor& hidden) {
  auto it = blocks_.find(index);
  PTRAIN_CHECK(it != blocks_.end(), "regression: block ", index, " is not built on this rank");
  return it->second->forward(hidden);
}

at::Tensor RegressionModel::predict(const at::Tensor& hidden) {
  PTRAIN_CHECK(out_, "regression: head on a rank that did not build it");
  return out_(head_norm_(hidden)).to(torch::kFloat32);
}

ptrain::LossOutput RegressionModel::head(const at::Tensor& hidden, const ptrain::Batch& micro) {
  const at::Tensor y = predict(hidden);
  const at::Tensor targets = micro.at("targets").to(y.device(), torch::kFloat32);
  ptrain::LossOutput loss;
  loss.loss_sum = (y - targets).pow(2).sum();
  loss.count = static_cast<double>(targets.numel());
  return loss;
}

}  // namespace regression

#include "ptrain/engine/optimizer.h"

#include <cmath>

#include <torch/torch.h>

#include "ptrain/recipe/recipe.h"

namespace ptrain {

OptimizerOptions OptimizerOptions::fromRecipe(const Recipe& r) {
  OptimizerOptions o;
  o.name = r.getString("optimizer.name");
  o.lr = r.getFloat("optimizer.lr");
  o.min_lr = r.getFloat("optimizer.min_lr");
  o.weight_decay = r.getFloat("optimizer.weight_decay");
  o.beta1 = r.getFloat("optimizer.beta1");
  o.beta2 = r.getFloat("optimizer.beta2");
  o.eps = r.getFloat("optimizer.eps");
  o.clip_grad = r.getFloat("optimizer.clip_grad");
  o.schedule = r.getString("optimizer.lr_schedule");
  o.warmup_steps = r.getInt("optimizer.warmup_steps");
  o.total_steps = r.getInt("train.steps");
  return o;
}

double learningRate(const OptimizerOptions& o, int64_t step) {
  if (o.warmup_steps > 0 && step < o.warmup_steps) {
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  }
  if (o.schedule == "constant") return o.lr;
  const double span = static_cast<double>(std::max<int64_t>(1, o.total_steps - o.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / span);
  if (o.schedule == "linear") return o.min_lr + (o.lr - o.min_lr) * (1.0 - progress);
  // cosine
  return o.min_lr + (o.lr - o.min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

Optimizer::Optimizer(std::vector<std::pair<std::string, at::Tensor>> named, OptimizerOptions options)
    : options_(std::move(options)) {
  for (auto& [name, p] : named) {
    if (!p.requires_grad()) continue;
    names_.push_back(name);
    params_.push_back(p);
    hasDecay_.push_back(p.dim() >= 2);
    expAvg_.push_back(torch::zeros_like(p));
    expAvgSq_.push_back(torch::zeros_like(p));
  }
}

void Optimizer::zeroGrad() {
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

void Optimizer::step(double lr) {
  torch::NoGradGuard noGrad;
  ++step_;
  std::vector<at::Tensor> ps, gs, ms, vs, decayed;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined()) continue;
    ps.push_back(params_[i]);
    gs.push_back(params_[i].grad());
    ms.push_back(expAvg_[i]);
    vs.push_back(expAvgSq_[i]);
    if (hasDecay_[i]) decayed.push_back(params_[i]);
  }
  if (ps.empty()) return;
  if (options_.name == "sgd") {
    if (options_.weight_decay > 0 && !decayed.empty()) at::_foreach_mul_(decayed, 1.0 - lr * options_.weight_decay);
    at::_foreach_add_(ps, gs, -lr);
    return;
  }
  const double b1 = options_.beta1, b2 = options_.beta2;
  if (options_.weight_decay > 0 && !decayed.empty()) at::_foreach_mul_(decayed, 1.0 - lr * options_.weight_decay);
  at::_foreach_mul_(ms, b1);
  at::_foreach_add_(ms, gs, 1.0 - b1);
  at::_foreach_mul_(vs, b2);
  at::_foreach_addcmul_(vs, gs, gs, 1.0 - b2);
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step_));
  auto denom = at::_foreach_sqrt(vs);
  at::_foreach_div_(denom, std::sqrt(bc2));
  at::_foreach_add_(denom, options_.eps);
  at::_foreach_addcdiv_(ps, ms, denom, -lr / bc1);
}

std::vector<std::pair<std::string, at::Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < names_.size(); ++i) {
    out.emplace_back("exp_avg." + names_[i], expAvg_[i]);
    out.emplace_back("exp_avg_sq." + names_[i], expAvgSq_[i]);
  }
  return out;
}

void Optimizer::load(const std::map<std::string, at::Tensor>& state, int64_t stepCount) {
  torch::NoGradGuard noGrad;
  for (size_t i = 0; i < names_.size(); ++i) {
    for (auto [prefix, target] : {std::pair{"exp_avg.", &expAvg_[i]}, std::pair{"exp_avg_sq.", &expAvgSq_[i]}}) {
      auto it = state.find(prefix + names_[i]);
      if (it == state.end()) {
        throw CheckpointError(detail::concat("optimizer state has no '", prefix, names_[i],
                                             "': the checkpoint is from another model"));
      }
      if (!it->second.sizes().equals(target->sizes())) {
        throw CheckpointError(detail::concat("optimizer state '", prefix, names_[i], "' has shape ",
                                             it->second.sizes(), ", this model needs ", target->sizes(),
                                             ": the checkpoint is from another model"));
      }
      target->copy_(it->second);
    }
  }
  step_ = stepCount;
}

double clipGradNorm(const std::vector<at::Tensor>& params, double maxNorm,
                    const std::function<void(at::Tensor&)>& sumSquares, const std::vector<bool>& counted) {
  torch::NoGradGuard noGrad;
  std::vector<at::Tensor> grads, countedGrads;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!p.grad().defined()) continue;
    grads.push_back(p.grad());
    if (counted.empty() || counted[i]) countedGrads.push_back(p.grad());
  }
  at::Tensor total = torch::zeros({}, torch::kFloat64);
  if (!countedGrads.empty()) {
    auto norms = at::_foreach_norm(countedGrads, 2);
    total = torch::stack(norms).to(torch::kFloat64).pow(2).sum();
  }
  if (sumSquares) sumSquares(total);
  const double norm = std::sqrt(total.item<double>());
  if (maxNorm > 0 && norm > maxNorm && !grads.empty()) {
    at::_foreach_mul_(grads, maxNorm / (norm + 1e-6));
  }
  return norm;
}

}  // namespace ptrain

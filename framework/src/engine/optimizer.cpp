#include "ptrain/engine/optimizer.h"

#include <cmath>

#include <torch/torch.h>

#include "ptrain/recipe/recipe.h"
#include "adamw_kernel.h"

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
  o.momentum = r.getFloat("optimizer.momentum");
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

namespace {

// The fused kernel takes float32 tensors in host memory laid out densely
// alike; anything else (other dtypes, devices) goes through foreach kernels.
bool fusable(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v) {
  for (const at::Tensor* t : {&p, &g, &m, &v}) {
    if (!t->is_cpu() || t->scalar_type() != at::kFloat || !t->is_contiguous()) return false;
  }
  return g.sizes().equals(p.sizes()) && m.sizes().equals(p.sizes()) && v.sizes().equals(p.sizes());
}

}  // namespace

void Optimizer::step(double lr, double gradScale) {
  torch::NoGradGuard noGrad;
  ++step_;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step_));
  const double decayFactor = 1.0 - lr * options_.weight_decay;
  const bool adamw = options_.name == "adamw";
  // Tensors the fused kernel cannot take, updated with foreach kernels below.
  std::vector<at::Tensor> ps, gs, ms, vs, decayed, decayedGrads;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    const at::Tensor& g = p.grad();
    if (adamw && fusable(p, g, expAvg_[i], expAvgSq_[i])) {
      detail::AdamwStep s;
      s.decay_factor = static_cast<float>(hasDecay_[i] ? decayFactor : 1.0);
      s.beta1 = static_cast<float>(b1);
      s.beta2 = static_cast<float>(b2);
      s.grad_scale = static_cast<float>(gradScale);
      s.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bc2));
      s.eps = static_cast<float>(options_.eps);
      s.step_size = static_cast<float>(lr / bc1);
      detail::adamwUpdate(p.data_ptr<float>(), g.data_ptr<float>(), expAvg_[i].data_ptr<float>(),
                          expAvgSq_[i].data_ptr<float>(), p.numel(), s);
      continue;
    }
    ps.push_back(p);
    gs.push_back(g);
    ms.push_back(expAvg_[i]);
    vs.push_back(expAvgSq_[i]);
    if (hasDecay_[i]) {
      decayed.push_back(p);
      decayedGrads.push_back(g);
    }
  }
  if (ps.empty()) return;
  if (gradScale != 1.0) at::_foreach_mul_(gs, gradScale);
  if (!adamw) {
    // As torch.optim.SGD: an L2 penalty added to the gradient (g += wd * p),
    // then momentum without dampening (buf = momentum * buf + g).
    if (options_.weight_decay > 0 && !decayed.empty()) at::_foreach_add_(decayedGrads, decayed, options_.weight_decay);
    if (options_.momentum > 0) {
      at::_foreach_mul_(ms, options_.momentum);
      at::_foreach_add_(ms, gs);
      at::_foreach_add_(ps, ms, -lr);
    } else {
      at::_foreach_add_(ps, gs, -lr);
    }
    return;
  }
  if (options_.weight_decay > 0 && !decayed.empty()) at::_foreach_mul_(decayed, decayFactor);
  at::_foreach_mul_(ms, b1);
  at::_foreach_add_(ms, gs, 1.0 - b1);
  at::_foreach_mul_(vs, b2);
  at::_foreach_addcmul_(vs, gs, gs, 1.0 - b2);
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

double globalGradNorm(const std::vector<at::Tensor>& params,
                      const std::function<void(at::Tensor&)>& sumSquares, const std::vector<bool>& counted) {
  torch::NoGradGuard noGrad;
  std::vector<at::Tensor> countedGrads;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (p.grad().defined() && (counted.empty() || counted[i])) countedGrads.push_back(p.grad());
  }
  at::Tensor total = torch::zeros({}, torch::kFloat64);
  if (!countedGrads.empty()) {
    auto norms = at::_foreach_norm(countedGrads, 2);
    total = torch::stack(norms).to(torch::kFloat64).pow(2).sum();
  }
  if (sumSquares) sumSquares(total);
  return std::sqrt(total.item<double>());
}

double clipCoefficient(double norm, double maxNorm) {
  if (maxNorm > 0 && norm > maxNorm) return maxNorm / (norm + 1e-6);
  return 1.0;
}

}  // namespace ptrain

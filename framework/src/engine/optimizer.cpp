#include "ptrain/engine/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "ptrain/recipe/recipe.h"
#include "adamw_kernel.h"
#include "sparse_rows.h"
#include "ptrain/core/device.h"

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
  o.distributed = r.getBool("optimizer.distributed");
  return o;
}

bool OptimizerOptions::isSparse(const std::string& parameterName) const {
  if (sparse_name == "none") return false;
  for (const auto& prefix : sparse_prefixes) {
    if (parameterName.rfind(prefix, 0) == 0) return true;
  }
  return false;
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

Optimizer::~Optimizer() = default;

Optimizer::Optimizer(std::vector<std::pair<std::string, at::Tensor>> named, std::vector<ParamGroup> groups,
                     std::vector<std::string> slots, bool masterWeights)
    : Optimizer(std::move(named), std::move(groups), std::move(slots), masterWeights, SlotSizes()) {}

Optimizer::Optimizer(std::vector<std::pair<std::string, at::Tensor>> named, std::vector<ParamGroup> groups,
                     std::vector<std::string> slots, bool masterWeights, const SlotSizes& slotSizes)
    : groups_(std::move(groups)), slotNames_(std::move(slots)) {
  // Positions in `named` -> positions among the kept parameters.
  std::vector<long> keptAt(named.size(), -1);
  for (size_t i = 0; i < named.size(); ++i) {
    auto& [name, p] = named[i];
    if (!p.requires_grad()) continue;
    keptAt[i] = static_cast<long>(names_.size());
    names_.push_back(name);
    params_.push_back(p);
  }
  groupOf_.assign(params_.size(), groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<size_t> kept;
    for (size_t i : groups_[g].index) {
      PTRAIN_CHECK(i < named.size(), "optimizer group '", groups_[g].name, "' names parameter ", i, " of ",
                   named.size());
      if (keptAt[i] < 0) continue;
      const size_t k = static_cast<size_t>(keptAt[i]);
      PTRAIN_CHECK(groupOf_[k] == groups_.size(), "optimizer: parameter '", names_[k], "' is in two groups");
      groupOf_[k] = g;
      kept.push_back(k);
    }
    groups_[g].index = std::move(kept);
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    PTRAIN_CHECK(groupOf_[k] < groups_.size(), "optimizer: parameter '", names_[k], "' is in no group");
  }
  torch::NoGradGuard noGrad;
  for (const auto& p : params_) {
    const bool needsMaster = masterWeights && p.scalar_type() != at::kFloat;
    master_.push_back(needsMaster ? p.detach().to(at::kFloat).clone() : at::Tensor());
  }
  slots_.resize(slotNames_.size());
  for (size_t s = 0; s < slotNames_.size(); ++s) {
    for (size_t k = 0; k < params_.size(); ++k) {
      const at::Tensor& like = master_[k].defined() ? master_[k] : params_[k];
      if (!slotSizes) {
        slots_[s].push_back(torch::zeros_like(like));
        continue;
      }
      const auto sizes = slotSizes(s, names_[k], like);
      if (!sizes) {
        slots_[s].emplace_back();
      } else if (like.sizes().equals(*sizes)) {
        slots_[s].push_back(torch::zeros_like(like));
      } else {
        slots_[s].push_back(torch::zeros(*sizes, like.options()));
      }
    }
  }
}

bool Optimizer::step(double lr, double gradScale) {
  torch::NoGradGuard noGrad;
  // One parameter's item, made from the tensors as they are now (an
  // update_observer may just have moved them).
  auto itemOf = [&](size_t k) {
    const at::Tensor& p = params_[k];
    const ParamGroup& g = groups_[groupOf_[k]];
    if (master_[k].defined()) return Item{k, master_[k], p.grad().to(at::kFloat), lr * g.lr_scale, g.weight_decay};
    return Item{k, p, p.grad(), lr * g.lr_scale, g.weight_decay};
  };
  ++step_;
  if (!update_observer) {
    std::vector<Item> items;
    items.reserve(params_.size());
    for (size_t k = 0; k < params_.size(); ++k)
      if (params_[k].grad().defined()) items.push_back(itemOf(k));
    update(items, gradScale, step_);
    for (const Item& item : items) {
      if (master_[item.index].defined()) params_[item.index].copy_(master_[item.index]);
    }
    return true;
  }
  // The item is made after the observer brought the parameter's tensors to
  // where the update runs (an offload tier: the host or the device).
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!params_[k].grad().defined()) continue;
    update_observer(k, false);
    update({itemOf(k)}, gradScale, step_);
    if (master_[k].defined()) params_[k].copy_(master_[k]);
    update_observer(k, true);
  }
  return true;
}

std::vector<at::Tensor> Optimizer::stateOf(size_t i) const {
  std::vector<at::Tensor> out;
  for (const auto& slot : slots_)
    if (slot[i].defined()) out.push_back(slot[i]);
  if (master_[i].defined()) out.push_back(master_[i]);
  return out;
}

void Optimizer::zeroGrad() {
  for (size_t k = 0; k < params_.size(); ++k) {
    at::Tensor& p = params_[k];
    if (!p.grad().defined()) continue;
    if (releasesGradient(k)) p.mutable_grad().reset();
    else p.mutable_grad().zero_();
  }
}

std::vector<std::pair<std::string, at::Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t k = 0; k < names_.size(); ++k) {
    for (size_t s = 0; s < slotNames_.size(); ++s) {
      if (slots_[s][k].defined()) out.emplace_back(slotNames_[s] + "." + names_[k], slots_[s][k]);
    }
    if (master_[k].defined()) out.emplace_back("master." + names_[k], master_[k]);
  }
  return out;
}

void Optimizer::load(const std::map<std::string, at::Tensor>& state, int64_t stepCount) {
  torch::NoGradGuard noGrad;
  auto restore = [&](const std::string& key, at::Tensor& target) {
    auto it = state.find(key);
    if (it == state.end()) {
      throw CheckpointError(detail::concat("optimizer state has no '", key, "': the checkpoint is from another model"));
    }
    if (!it->second.sizes().equals(target.sizes())) {
      throw CheckpointError(detail::concat("optimizer state '", key, "' has shape ", it->second.sizes(),
                                           ", this model needs ", target.sizes(),
                                           ": the checkpoint is from another model"));
    }
    target.copy_(it->second);
  };
  for (size_t k = 0; k < names_.size(); ++k) {
    for (size_t s = 0; s < slotNames_.size(); ++s) {
      if (slots_[s][k].defined()) restore(slotNames_[s] + "." + names_[k], slots_[s][k]);
    }
    if (master_[k].defined()) restore("master." + names_[k], master_[k]);
  }
  step_ = stepCount;
}

namespace {

// The fused kernels take float32 tensors laid out densely alike on one
// device: the host, or (in builds with CUDA) one GPU. Anything else (other
// dtypes, mixed devices) goes through foreach kernels.
bool fusable(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v) {
  const bool onHost = p.is_cpu();
  if (!onHost && !(PTRAIN_WITH_CUDA && p.is_cuda())) return false;
  for (const at::Tensor* t : {&p, &g, &m, &v}) {
    if (t->device() != p.device() || t->scalar_type() != at::kFloat || !t->is_contiguous()) return false;
  }
  return g.sizes().equals(p.sizes()) && m.sizes().equals(p.sizes()) && v.sizes().equals(p.sizes());
}

void fusedAdamw(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, const detail::AdamwStep& s) {
#if PTRAIN_WITH_CUDA
  if (p.is_cuda()) {
    detail::adamwUpdateCuda(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                            p.numel(), s, detail::currentCudaStream(p.device()));
    return;
  }
#endif
  detail::adamwUpdate(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), p.numel(),
                      s);
}

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<std::pair<std::string, at::Tensor>> named, std::vector<ParamGroup> groups,
        const OptimizerOptions& o)
      : Optimizer(std::move(named), std::move(groups), {"exp_avg", "exp_avg_sq"}, o.master_weights),
        beta1_(o.beta1),
        beta2_(o.beta2),
        eps_(o.eps) {}
  const char* name() const override { return "adamw"; }

 protected:
  // For optimizers that add slots after exp_avg and exp_avg_sq (which the
  // AdamW update reads as slots 0 and 1).
  AdamW(std::vector<std::pair<std::string, at::Tensor>> named, std::vector<ParamGroup> groups,
        const OptimizerOptions& o, std::vector<std::string> slots, const SlotSizes& slotSizes)
      : Optimizer(std::move(named), std::move(groups), std::move(slots), o.master_weights, slotSizes),
        beta1_(o.beta1),
        beta2_(o.beta2),
        eps_(o.eps) {}

  void update(const std::vector<Item>& items, double gradScale, int64_t count) override {
    const double bc1 = 1.0 - std::pow(beta1_, static_cast<double>(count));
    const double bc2 = 1.0 - std::pow(beta2_, static_cast<double>(count));
    // Tensors the fused kernel cannot take, updated with foreach kernels
    // below, one batch per (lr, weight decay) pair.
    std::map<std::pair<double, double>, std::vector<const Item*>> rest;
    for (const Item& item : items) {
      at::Tensor& m = slot(0, item.index);
      at::Tensor& v = slot(1, item.index);
      if (fusable(item.target, item.grad, m, v)) {
        detail::AdamwStep s;
        s.decay_factor = static_cast<float>(1.0 - item.lr * item.weight_decay);
        s.beta1 = static_cast<float>(beta1_);
        s.beta2 = static_cast<float>(beta2_);
        s.grad_scale = static_cast<float>(gradScale);
        s.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bc2));
        s.eps = static_cast<float>(eps_);
        s.step_size = static_cast<float>(item.lr / bc1);
        at::Tensor target = item.target;
        fusedAdamw(target, item.grad, m, v, s);
        continue;
      }
      rest[{item.lr, item.weight_decay}].push_back(&item);
    }
    for (const auto& [key, batch] : rest) {
      const auto [lr, weightDecay] = key;
      std::vector<at::Tensor> ps, gs, ms, vs;
      for (const Item* item : batch) {
        ps.push_back(item->target);
        gs.push_back(item->grad);
        ms.push_back(slot(0, item->index));
        vs.push_back(slot(1, item->index));
      }
      if (gradScale != 1.0) at::_foreach_mul_(gs, gradScale);
      if (weightDecay > 0) at::_foreach_mul_(ps, 1.0 - lr * weightDecay);
      at::_foreach_mul_(ms, beta1_);
      at::_foreach_add_(ms, gs, 1.0 - beta1_);
      at::_foreach_mul_(vs, beta2_);
      at::_foreach_addcmul_(vs, gs, gs, 1.0 - beta2_);
      auto denom = at::_foreach_sqrt(vs);
      at::_foreach_div_(denom, std::sqrt(bc2));
      at::_foreach_add_(denom, eps_);
      at::_foreach_addcdiv_(ps, ms, denom, -lr / bc1);
    }
  }

 private:
  double beta1_, beta2_, eps_;
};

// AdamW for the dense parameters, a sparse row update for the tables
// (OptimizerOptions::sparse_name). Slots: exp_avg and exp_avg_sq (AdamW's,
// and sparse_adam's moments), row_sum (rowwise_adagrad's accumulator).
class SparseRowsAdamW final : public AdamW {
 public:
  SparseRowsAdamW(std::vector<std::pair<std::string, at::Tensor>> named, std::vector<ParamGroup> groups,
                  const OptimizerOptions& o)
      : AdamW(std::move(named), std::move(groups), o, {"exp_avg", "exp_avg_sq", "row_sum"}, slotSizes(o)),
        rowwise_(o.sparse_name == "rowwise_adagrad"),
        name_("adamw+" + o.sparse_name),
        beta1_(o.beta1),
        beta2_(o.beta2),
        eps_(o.eps) {
    for (const auto& n : parameterNames()) sparse_.push_back(o.isSparse(n));
  }
  const char* name() const override { return name_.c_str(); }

 protected:
  bool releasesGradient(size_t index) const override { return sparse_[index]; }

  void update(const std::vector<Item>& items, double gradScale, int64_t count) override {
    std::vector<Item> dense;
    for (const Item& item : items) {
      if (!sparse_[item.index]) {
        dense.push_back(item);
        continue;
      }
      at::Tensor target = item.target;
      if (rowwise_) {
        detail::rowwiseAdagradRows(target, item.grad, slot(2, item.index), item.lr, eps_, item.weight_decay,
                                   gradScale);
      } else {
        detail::sparseAdamRows(target, item.grad, slot(0, item.index), slot(1, item.index), item.lr, beta1_, beta2_,
                               eps_, item.weight_decay, gradScale, count);
      }
    }
    if (!dense.empty()) AdamW::update(dense, gradScale, count);
  }

 private:
  static SlotSizes slotSizes(const OptimizerOptions& o) {
    const bool rowwise = o.sparse_name == "rowwise_adagrad";
    return [o, rowwise](size_t s, const std::string& name,
                        const at::Tensor& p) -> std::optional<std::vector<int64_t>> {
      if (!o.isSparse(name)) return s < 2 ? std::optional<std::vector<int64_t>>(p.sizes().vec()) : std::nullopt;
      PTRAIN_CHECK_AS(ConfigError, p.dim() == 2, "optimizer.sparse_name ", o.sparse_name, ": '", name,
                      "' is not a table of rows (shape ", p.sizes(),
                      "); sparse rows need 2-d parameters (and not optimizer.distributed, which flattens them)");
      if (rowwise) return s == 2 ? std::optional<std::vector<int64_t>>(std::vector<int64_t>{p.size(0)}) : std::nullopt;
      return s < 2 ? std::optional<std::vector<int64_t>>(p.sizes().vec()) : std::nullopt;
    };
  }

  bool rowwise_;
  std::string name_;
  double beta1_, beta2_, eps_;
  std::vector<bool> sparse_;  // per parameter
};

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<std::pair<std::string, at::Tensor>> named, std::vector<ParamGroup> groups,
      const OptimizerOptions& o)
      // Without momentum there is nothing to keep between steps.
      : Optimizer(std::move(named), std::move(groups),
                  o.momentum > 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{},
                  o.master_weights),
        momentum_(o.momentum) {}
  const char* name() const override { return "sgd"; }

 protected:
  void update(const std::vector<Item>& items, double gradScale, int64_t count) override {
    std::map<std::pair<double, double>, std::vector<const Item*>> batches;
    for (const Item& item : items) batches[{item.lr, item.weight_decay}].push_back(&item);
    for (const auto& [key, batch] : batches) {
      const auto [lr, weightDecay] = key;
      std::vector<at::Tensor> ps, gs, bufs;
      for (const Item* item : batch) {
        ps.push_back(item->target);
        gs.push_back(item->grad);
        if (momentum_ > 0) bufs.push_back(slot(0, item->index));
      }
      if (gradScale != 1.0) at::_foreach_mul_(gs, gradScale);
      // As torch.optim.SGD: an L2 penalty added to the gradient (g += wd * p),
      // then momentum without dampening (buf = momentum * buf + g).
      if (weightDecay > 0) at::_foreach_add_(gs, ps, weightDecay);
      if (momentum_ > 0) {
        at::_foreach_mul_(bufs, momentum_);
        at::_foreach_add_(bufs, gs);
        at::_foreach_add_(ps, bufs, -lr);
      } else {
        at::_foreach_add_(ps, gs, -lr);
      }
    }
  }

 private:
  double momentum_;
};

}  // namespace

std::unique_ptr<Optimizer> makeOptimizer(std::vector<std::pair<std::string, at::Tensor>> named,
                                         std::vector<ParamGroup> groups, const OptimizerOptions& options) {
  if (options.sparse_name != "none") {
    PTRAIN_CHECK_AS(ConfigError, options.sparse_name == "rowwise_adagrad" || options.sparse_name == "sparse_adam",
                    "optimizer.sparse_name: '", options.sparse_name,
                    "' is not a sparse optimizer; use none, rowwise_adagrad or sparse_adam");
    PTRAIN_CHECK_AS(ConfigError, options.name == "adamw", "optimizer.sparse_name ", options.sparse_name,
                    " updates the tables beside adamw, not ", options.name, "; set optimizer.name to adamw");
    PTRAIN_CHECK_AS(ConfigError, options.sparse_lr >= 0 && options.sparse_weight_decay >= 0,
                    "optimizer: sparse_lr and sparse_weight_decay must be at least 0");
    return std::make_unique<SparseRowsAdamW>(std::move(named), std::move(groups), options);
  }
  if (options.name == "adamw") return std::make_unique<AdamW>(std::move(named), std::move(groups), options);
  if (options.name == "sgd") return std::make_unique<Sgd>(std::move(named), std::move(groups), options);
  throw ConfigError("optimizer.name: '" + options.name + "' is not an optimizer; use adamw or sgd");
}

std::unique_ptr<Optimizer> makeOptimizer(std::vector<std::pair<std::string, at::Tensor>> named,
                                         const OptimizerOptions& options) {
  ParamGroup decay{"decay", options.weight_decay, 1.0, {}};
  ParamGroup plain{"no_decay", 0.0, 1.0, {}};
  if (options.sparse_name != "none") {
    const double scale = options.sparse_lr > 0 ? options.sparse_lr / options.lr : 1.0;
    ParamGroup sparse{"sparse", options.sparse_weight_decay, scale, {}};
    for (size_t i = 0; i < named.size(); ++i) {
      if (options.isSparse(named[i].first)) {
        sparse.index.push_back(i);
      } else {
        (named[i].second.dim() >= 2 ? decay : plain).index.push_back(i);
      }
    }
    return makeOptimizer(std::move(named), {decay, plain, sparse}, options);
  }
  for (size_t i = 0; i < named.size(); ++i) (named[i].second.dim() >= 2 ? decay : plain).index.push_back(i);
  return makeOptimizer(std::move(named), {decay, plain}, options);
}

namespace {

// The sum of the squares of a host float32 tensor's values, accumulated in
// float64 over fixed blocks added in order. A float32 sum over millions of
// values carries a relative error of about 1e-4 that depends on how the
// tensor is cut, which would make the clipping coefficient, and so every
// update, depend on the layout (a tensor-parallel shard sums differently from
// the whole tensor). The fixed blocks make it independent of the thread count
// too.
double hostSumOfSquares(const at::Tensor& g) {
  constexpr int64_t kBlock = int64_t{1} << 16;
  const float* data = g.data_ptr<float>();
  const int64_t n = g.numel();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * kBlock, last = std::min(n, first + kBlock);
      double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      int64_t i = first;
      for (; i + 4 <= last; i += 4) {
        const double x0 = data[i], x1 = data[i + 1], x2 = data[i + 2], x3 = data[i + 3];
        a0 += x0 * x0;
        a1 += x1 * x1;
        a2 += x2 * x2;
        a3 += x3 * x3;
      }
      for (; i < last; ++i) a0 += static_cast<double>(data[i]) * data[i];
      partial[static_cast<size_t>(b)] = (a0 + a1) + (a2 + a3);
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

// The same for any other tensor (a device's, another dtype), as a float64
// scalar where it rests: blocks of the flat tensor cast to float64, so no
// more than one block's copy exists at a time.
at::Tensor deviceSumOfSquares(const at::Tensor& g) {
  constexpr int64_t kBlock = int64_t{1} << 24;
  const at::Tensor flat = g.reshape({-1});
  at::Tensor total = torch::zeros({}, flat.options().dtype(at::kDouble));
  for (int64_t first = 0; first < flat.numel(); first += kBlock) {
    const at::Tensor part = flat.narrow(0, first, std::min(kBlock, flat.numel() - first)).to(at::kDouble);
    total += part.mul(part).sum();
  }
  return total;
}

}  // namespace

double globalGradNorm(const std::vector<at::Tensor>& params,
                      const std::function<void(at::Tensor&)>& sumSquares, const std::vector<bool>& counted,
                      std::optional<at::Device> device) {
  torch::NoGradGuard noGrad;
  double host = 0;
  // Other devices' sums stay there until the end: one synchronisation.
  std::vector<at::Tensor> elsewhere;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (!g.defined() || !(counted.empty() || counted[i])) continue;
    if (!device) device = g.device();
    if (g.is_cpu() && g.scalar_type() == at::kFloat && g.is_contiguous()) {
      host += hostSumOfSquares(g);
    } else {
      elsewhere.push_back(deviceSumOfSquares(g));
    }
  }
  const at::Device home = device.value_or(params.empty() ? at::Device(at::kCPU) : params.front().device());
  at::Tensor total = torch::tensor({host}, torch::kFloat64).reshape({}).to(home);
  for (const auto& t : elsewhere) total += t.to(home);
  if (sumSquares) sumSquares(total);
  return std::sqrt(total.item<double>());
}

double clipCoefficient(double norm, double maxNorm) {
  if (maxNorm > 0 && norm > maxNorm) return maxNorm / (norm + 1e-6);
  return 1.0;
}

}  // namespace ptrain

#include "ptrain/datasets/clicks_reference.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <numeric>

#include "ptrain/core/error.h"
#include "ptrain/datasets/auc.h"

namespace ptrain::datasets {

namespace {

// The hidden model's terms in clicksTermName's order, and its dense groups.
enum Term { kFirstOrder, kPairwise, kUserItem, kInterestCategory, kDense, kDenseItem, kAttention };
constexpr int64_t kFields = kClicksSparseFeatures;
constexpr int64_t kDenseHidden = 16;  // clicks.cpp's kDenseHidden and kDenseGroups
constexpr int64_t kDenseGroups = 4;
constexpr int64_t kStandardisationSamples = 8192;

bool learns(ClicksReferenceTerms terms, int term) {
  switch (terms) {
    case ClicksReferenceTerms::kPairwise:
      return term == kPairwise;
    case ClicksReferenceTerms::kFirstOrderAndPairwise:
      return term == kPairwise || term == kFirstOrder;
    case ClicksReferenceTerms::kAll:
      return true;
  }
  return false;
}

// The dense log counts' mean and 1/deviation per feature.
struct Standardisation {
  at::Tensor mean, scale;  // [13]
};

// One split's samples as the learner reads them: ids offset into one table
// of all rows, the given terms' sum, the pairwise contribution (to score the
// learner against) and the labels; for kAll also the dense features, the
// history and the category group.
struct Samples {
  at::Tensor ids;       // [N, 26] int64
  at::Tensor given;     // [N] float
  at::Tensor pairwise;  // [N] double
  at::Tensor labels;    // [N] float
  at::Tensor probabilities;  // [N] double, the hidden model's (validation only)
  at::Tensor dense;     // [N, 13] float, log counts (standardised by the learner)
  at::Tensor history;   // [N, H] int64 rows of the item table (0 on padding)
  at::Tensor mask;      // [N, H] float, 1 on valid history slots
  at::Tensor group;     // [N] int64, category mod 4
};

Samples read(const ClicksDataset& data, ClicksSplit split, int64_t first, int64_t count,
             const std::vector<int64_t>& offsets, ClicksReferenceTerms terms) {
  const ClicksOptions& d = data.options();
  const ClicksExamples e = data.examples(split, first, count);
  // The hidden model's terms (drawn again from the samples' features) feed
  // the given sum and the score of the pairwise part; a training batch that
  // learns every term needs neither.
  const bool scored = split == ClicksSplit::kValidation;
  const std::vector<double> contributions = terms != ClicksReferenceTerms::kAll || scored
                                                ? data.termContributions(split, first, count)
                                                : std::vector<double>(static_cast<size_t>(count * kClicksTerms), 0.0);
  std::vector<float> given(static_cast<size_t>(count));
  std::vector<double> pairwise(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int k = 0; k < kClicksTerms; ++k) {
      if (!learns(terms, k)) sum += contributions[static_cast<size_t>(i * kClicksTerms + k)];
    }
    given[static_cast<size_t>(i)] = static_cast<float>(sum);
    pairwise[static_cast<size_t>(i)] = contributions[static_cast<size_t>(i * kClicksTerms + kPairwise)];
  }
  const at::Tensor sparse = torch::tensor(e.sparse, torch::kInt64).reshape({count, kFields});
  Samples s;
  s.ids = sparse + torch::tensor(offsets, torch::kInt64).unsqueeze(0);
  s.given = torch::tensor(given, torch::kFloat32);
  s.pairwise = torch::tensor(pairwise, torch::kFloat64);
  s.labels = torch::tensor(e.labels, torch::kFloat32);
  if (scored) s.probabilities = torch::tensor(e.probabilities, torch::kFloat64);
  if (terms == ClicksReferenceTerms::kAll) {
    s.dense = torch::tensor(e.dense, torch::kFloat32).reshape({count, kClicksDenseFeatures});
    const at::Tensor history = torch::tensor(e.history, torch::kInt64).reshape({count, e.history_length});
    const at::Tensor valid = history >= 0;
    s.mask = valid.to(torch::kFloat32);
    s.history = torch::where(valid, history, torch::zeros_like(history)) + offsets[d.item_feature];
    s.group = sparse.select(1, d.category_feature).remainder(kDenseGroups);
  }
  return s;
}

// The rows of `table` at `ids`, [ids..., D], with a sparse gradient: a step
// touches a few thousand of the tables' rows.
at::Tensor rows(const at::Tensor& table, const at::Tensor& ids) {
  return torch::embedding(table, ids, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false, /*sparse=*/true);
}

// Adam on the rows a step touched, the others left as they are (lazy, as
// PyTorch's SparseAdam: moments decay only when a row is seen, bias
// correction by the global step; eps inside as torch::optim::Adam has it),
// so a step costs its rows, not the table.
struct LazyAdamTable {
  explicit LazyAdamTable(at::Tensor w) : weight(std::move(w)), m(torch::zeros_like(weight)), v(torch::zeros_like(weight)) {}

  void step(double lr, int64_t t) {
    torch::NoGradGuard noGrad;
    const at::Tensor grad = weight.grad().coalesce();
    const at::Tensor index = grad.indices()[0];
    const at::Tensor g = grad.values();
    const at::Tensor mRows = m.index_select(0, index).mul_(kBeta1).add_(g, 1 - kBeta1);
    const at::Tensor vRows = v.index_select(0, index).mul_(kBeta2).addcmul_(g, g, 1 - kBeta2);
    m.index_copy_(0, index, mRows);
    v.index_copy_(0, index, vRows);
    const double correction1 = 1 - std::pow(kBeta1, static_cast<double>(t));
    const double correction2 = 1 - std::pow(kBeta2, static_cast<double>(t));
    const at::Tensor update = mRows / ((vRows / correction2).sqrt_() + kEps) * (lr / correction1);
    weight.index_add_(0, index, update, -1);
  }

  static constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;  // torch::optim::Adam's defaults
  at::Tensor weight, m, v;
};

class Learner {
 public:
  Learner(int64_t rows, const ClicksReferenceOptions& o, const ClicksOptions& data, double startBias,
          Standardisation standardisation)
      : terms_(o.terms), data_(data), standardisation_(std::move(standardisation)) {
    at::Generator generator = at::detail::createCPUGenerator(o.seed);
    auto normal = [&](at::IntArrayRef shape, double std) {
      return torch::empty(shape).normal_(0.0, std, generator).requires_grad_();
    };
    vectors_ = normal({rows, o.dim}, o.init_std);
    pairWeights_ = normal({kFields * (kFields - 1) / 2}, o.init_std);
    bias_ = torch::full({}, startBias).requires_grad_();
    tables_.push_back(LazyAdamTable(vectors_));
    std::vector<at::Tensor> params{pairWeights_, bias_};
    if (learns(terms_, kFirstOrder)) {
      weights_ = torch::zeros({rows, 1}).requires_grad_();
      tables_.push_back(LazyAdamTable(weights_));
    }
    if (terms_ == ClicksReferenceTerms::kAll) {
      const double inScale = 1.0 / std::sqrt(static_cast<double>(kClicksDenseFeatures));
      w1_ = normal({kDenseHidden, kClicksDenseFeatures}, inScale);
      c1_ = torch::zeros({kDenseHidden}).requires_grad_();
      groups_ = normal({kDenseGroups, kDenseHidden}, o.init_std);
      w2_ = normal({o.dim, kDenseHidden}, o.init_std);
      temperature_ = torch::full({}, 1.0 / std::sqrt(static_cast<double>(o.dim))).requires_grad_();
      attentionWeight_ = torch::zeros({}).requires_grad_();
      for (const at::Tensor& p : {w1_, c1_, groups_, w2_, temperature_, attentionWeight_}) params.push_back(p);
    }
    optimizer_ = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(o.lr));
    pairs_ = torch::triu_indices(kFields, kFields, 1);
    pairs_ = pairs_[0] * kFields + pairs_[1];  // the upper triangle of a flattened [26, 26]
  }

  // The learned pairwise part of the logit, [N].
  at::Tensor pairwise(const at::Tensor& ids) const {
    at::Tensor v = rows(vectors_, ids);  // [N, 26, D]
    at::Tensor gram = torch::bmm(v, v.transpose(1, 2)).reshape({ids.size(0), kFields * kFields});
    return (gram.index_select(1, pairs_) * pairWeights_).sum(1);
  }

  at::Tensor logit(const Samples& s) const {
    at::Tensor z = bias_ + s.given + pairwise(s.ids);
    if (weights_.defined()) z = z + rows(weights_, s.ids).sum({1, 2});
    if (terms_ == ClicksReferenceTerms::kAll) {
      const at::Tensor item = rows(vectors_, s.ids.select(1, data_.item_feature));  // [N, D]
      const at::Tensor x = (s.dense - standardisation_.mean) * standardisation_.scale;
      const at::Tensor h = torch::tanh(torch::addmm(c1_, x, w1_.t()));                   // [N, 16]
      z = z + (groups_.index_select(0, s.group) * h).sum(1);                               // dense
      z = z + (torch::mm(h, w2_.t()) * item).sum(1);                                      // dense x item
      const at::Tensor past = rows(vectors_, s.history);  // [N, H, D]
      const at::Tensor scores = torch::bmm(past, item.unsqueeze(2)).squeeze(2) * temperature_;  // [N, H]
      // Padding gets no weight; every sample has at least min_history items,
      // and one without any scores 0 (as the hidden model does).
      const at::Tensor weights = torch::softmax(scores - (1 - s.mask) * 1e9, 1) * s.mask;
      z = z + attentionWeight_ * (weights * scores).sum(1);
    }
    return z;
  }

  void step(const Samples& batch, double lr) {
    for (auto& group : optimizer_->param_groups()) static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
    optimizer_->zero_grad();
    for (LazyAdamTable& t : tables_) t.weight.mutable_grad() = at::Tensor();
    torch::binary_cross_entropy_with_logits(logit(batch), batch.labels).backward();
    optimizer_->step();
    ++steps_;
    for (LazyAdamTable& t : tables_) t.step(lr, steps_);
  }

 private:
  ClicksReferenceTerms terms_;
  ClicksOptions data_;
  Standardisation standardisation_;
  at::Tensor vectors_, pairWeights_, bias_, weights_, pairs_;
  at::Tensor w1_, c1_, groups_, w2_, temperature_, attentionWeight_;
  std::unique_ptr<torch::optim::Adam> optimizer_;  // everything but the tables
  std::vector<LazyAdamTable> tables_;
  int64_t steps_ = 0;
};

Standardisation standardise(const ClicksDataset& data, int64_t count) {
  const ClicksExamples e = data.examples(ClicksSplit::kTrain, 0, count);
  const at::Tensor x = torch::tensor(e.dense, torch::kFloat32).reshape({count, kClicksDenseFeatures});
  Standardisation s;
  s.mean = x.mean(0);
  const at::Tensor deviation = (x - s.mean).pow(2).mean(0).sqrt();
  s.scale = torch::where(deviation > 0, 1 / deviation, torch::ones_like(deviation));
  return s;
}

double auc(const at::Tensor& scores, const at::Tensor& labels) {
  at::Tensor s = scores.to(torch::kFloat64).contiguous();
  at::Tensor y = labels.to(torch::kFloat64).contiguous();
  return rocAuc(s.data_ptr<double>(), y.data_ptr<double>(), s.numel());
}

// cov(learned, truth) / var(truth).
double slope(const at::Tensor& learned, const at::Tensor& truth) {
  at::Tensor x = truth - truth.mean();
  at::Tensor y = learned.to(torch::kFloat64) - learned.to(torch::kFloat64).mean();
  const double var = (x * x).sum().item<double>();
  return var > 0 ? (x * y).sum().item<double>() / var : 0.0;
}

}  // namespace

ClicksReferenceResult fitClicksReference(const ClicksDataset& data, const ClicksReferenceOptions& o,
                                         const std::function<void(const ClicksReferencePoint&)>& progress) {
  PTRAIN_CHECK_AS(ConfigError, o.batch_size >= 1 && o.samples >= o.batch_size, "clicks reference: ", o.samples,
                  " samples in batches of ", o.batch_size, ": need at least one whole batch");
  PTRAIN_CHECK_AS(ConfigError, o.dim >= 1 && o.evaluations >= 1, "clicks reference: dim ", o.dim, " and evaluations ",
                  o.evaluations, " must be >= 1");
  PTRAIN_CHECK_AS(ConfigError, o.lr > 0 && std::isfinite(o.lr) && o.init_std > 0 && std::isfinite(o.init_std),
                  "clicks reference: lr ", o.lr, " and init_std ", o.init_std, " must be positive");
  const ClicksOptions& d = data.options();
  PTRAIN_CHECK_AS(ConfigError, d.validation_size >= 2, "clicks reference: validation_size ", d.validation_size,
                  " leaves nothing to score");
  torch::NoGradGuard outer;  // re-enabled for the steps only
  std::vector<int64_t> offsets(kFields);
  std::exclusive_scan(d.table_sizes.begin(), d.table_sizes.end(), offsets.begin(), int64_t{0});
  const int64_t rows = offsets.back() + d.table_sizes.back();

  const Samples validation = read(data, ClicksSplit::kValidation, 0, d.validation_size, offsets, o.terms);
  ClicksReferenceResult result;
  result.ground_truth_auc = auc(validation.probabilities, validation.labels);
  result.given_auc = auc(validation.given, validation.labels);

  const int64_t steps = o.samples / o.batch_size;
  Learner learner(rows, o, d, std::log(d.click_rate / (1 - d.click_rate)),
                  standardise(data, std::min(o.samples, kStandardisationSamples)));
  const int64_t evaluations = std::min(o.evaluations, steps);
  int64_t nextEvaluation = 1;
  for (int64_t step = 0; step < steps; ++step) {
    const Samples batch = read(data, ClicksSplit::kTrain, step * o.batch_size, o.batch_size, offsets, o.terms);
    {
      torch::AutoGradMode enable(true);
      const double pi = 3.141592653589793;
      learner.step(batch, o.lr * 0.5 * (1 + std::cos(pi * static_cast<double>(step) / static_cast<double>(steps))));
    }
    if ((step + 1) * evaluations >= nextEvaluation * steps) {
      ClicksReferencePoint point;
      point.samples = (step + 1) * o.batch_size;
      point.auc = auc(learner.logit(validation), validation.labels);
      point.pairwise_coefficient = slope(learner.pairwise(validation.ids), validation.pairwise);
      result.points.push_back(point);
      if (progress) progress(point);
      ++nextEvaluation;
    }
  }
  return result;
}

}  // namespace ptrain::datasets

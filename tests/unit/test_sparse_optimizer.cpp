// The sparse optimizers of embedding rows (engine/optimizer.h, sparse_name):
// row-wise Adagrad and sparse Adam beside AdamW, by hand:
//   - only rows with a gradient move; the others and their state stay bitwise;
//   - the touched rows follow the formulas, step after step, with the sparse
//     group's learning rate, weight decay and the step's gradient scale;
//   - the dense parameters get exactly what plain AdamW gives them;
//   - state names and shapes (one float per row for Adagrad), checkpoint
//     round trip, and the settings refused with ConfigError;
//   - bfloat16 tables with float32 masters, and the one-parameter-at-a-time
//     path of an offload tier (update_observer), give the same rows.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>

#include "ptrain/engine/optimizer.h"
#include "ptrain/engine/row_sparse.h"

namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

at::Tensor leaf(at::Tensor t) { return t.to(torch::kFloat).requires_grad_(true); }

ptrain::OptimizerOptions options(const std::string& sparse) {
  ptrain::OptimizerOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  o.sparse_name = sparse;
  o.sparse_prefixes = {"emb."};
  o.sparse_lr = 0.1;
  return o;
}

double at2(const at::Tensor& t, int64_t i, int64_t j) { return t.index({i, j}).item<double>(); }

// The host scan (bits of each row ORed) finds the rows ne(0).any(1) finds:
// -0 is zero, NaN, infinities and the smallest subnormal are not; a strided
// view takes the generic path with the same answer.
TEST(SparseOptimizer, TouchedRowsAreTheRowsWithAValueOtherThanZero) {
  at::Tensor g = torch::zeros({9, 5});
  g.index_put_({1, 4}, -0.0);
  g.index_put_({2, 0}, std::nan(""));
  g.index_put_({3, 2}, std::numeric_limits<float>::infinity());
  g.index_put_({5, 1}, std::numeric_limits<float>::denorm_min());
  g.index_put_({6, 3}, -1e-30);
  g.index_put_({8, 4}, 2.0);
  const at::Tensor expected = torch::tensor({2, 3, 5, 6, 8}, torch::kInt64);
  EXPECT_TRUE(torch::equal(ptrain::touchedRows(g), expected)) << ptrain::touchedRows(g);
  EXPECT_TRUE(torch::equal(g.ne(0).any(1).nonzero().squeeze(1), expected));  // libtorch agrees
  at::Tensor wide = torch::zeros({9, 10});
  wide.narrow(1, 0, 5).copy_(g);
  const at::Tensor strided = wide.narrow(1, 0, 5);
  ASSERT_FALSE(strided.is_contiguous());
  EXPECT_TRUE(torch::equal(ptrain::touchedRows(strided).cpu(), expected));
  EXPECT_EQ(ptrain::touchedRows(torch::zeros({4, 3})).numel(), 0);
}

TEST(SparseOptimizer, RowwiseAdagradMovesOnlyTouchedRowsByTheFormula) {
  at::Tensor table = leaf(torch::tensor({{1., 2.}, {3., 4.}, {5., 6.}, {7., 8.}}));
  at::Tensor dense = leaf(torch::tensor({{0.5, -0.5}, {1.5, 2.0}}));
  at::Tensor before = table.detach().clone();
  auto o = options("rowwise_adagrad");
  o.sparse_weight_decay = 0.01;
  auto opt = ptrain::makeOptimizer(Named{{"emb.t", table}, {"dense.w", dense}}, o);
  EXPECT_STREQ(opt->name(), "adamw+rowwise_adagrad");
  ASSERT_EQ(opt->groups().size(), 3u);
  EXPECT_EQ(opt->groups()[2].name, "sparse");
  EXPECT_NEAR(opt->groups()[2].lr_scale, 10.0, 1e-12);

  // The same dense parameter under plain AdamW: what the dense part must give.
  at::Tensor denseRef = leaf(dense.detach().clone());
  ptrain::OptimizerOptions plain = o;
  plain.sparse_name = "none";
  auto ref = ptrain::makeOptimizer(Named{{"dense.w", denseRef}}, plain);

  // Row 1 and 3 touched in step 1, row 1 again in step 2 (scaled by 0.5).
  const double lr = 0.1, eps = 1e-8, wd = 0.01;
  double w1[2] = {3, 4}, w3[2] = {7, 8}, s1 = 0, s3 = 0;
  auto adagrad = [&](double* w, double& s, double g0, double g1) {
    g0 += wd * w[0];
    g1 += wd * w[1];
    s += (g0 * g0 + g1 * g1) / 2;
    w[0] -= lr * g0 / (std::sqrt(s) + eps);
    w[1] -= lr * g1 / (std::sqrt(s) + eps);
  };
  for (int step = 1; step <= 2; ++step) {
    const double scale = step == 1 ? 1.0 : 0.5;
    at::Tensor g = step == 1 ? torch::tensor({{0., 0.}, {0.5, -1.}, {0., 0.}, {2., 0.}})
                             : torch::tensor({{0., 0.}, {-3., 1.}, {0., 0.}, {0., 0.}});
    table.mutable_grad() = g.to(torch::kFloat);
    at::Tensor dg = torch::tensor({{0.1, -0.2}, {0.3, step * 0.4}}).to(torch::kFloat);
    dense.mutable_grad() = dg.clone();
    denseRef.mutable_grad() = dg.clone();
    ASSERT_TRUE(opt->step(o.lr, scale));
    ASSERT_TRUE(ref->step(o.lr, scale));
    adagrad(w1, s1, g.index({1, 0}).item<double>() * scale, g.index({1, 1}).item<double>() * scale);
    if (step == 1) adagrad(w3, s3, 2.0, 0.0);

    EXPECT_TRUE(torch::equal(table.detach()[0], before[0])) << "untouched row 0, step " << step;
    EXPECT_TRUE(torch::equal(table.detach()[2], before[2])) << "untouched row 2, step " << step;
    for (int j = 0; j < 2; ++j) {
      EXPECT_NEAR(at2(table, 1, j), w1[j], 1e-6) << "row 1, step " << step;
      EXPECT_NEAR(at2(table, 3, j), w3[j], 1e-6) << "row 3, step " << step;
    }
    EXPECT_TRUE(torch::equal(dense.detach(), denseRef.detach())) << "the dense part is AdamW, step " << step;
  }
  // One accumulator per row, rows 0 and 2 still zero.
  const auto named = opt->state();
  std::map<std::string, at::Tensor> state(named.begin(), named.end());
  ASSERT_EQ(state.count("row_sum.emb.t"), 1u);
  EXPECT_EQ(state.count("exp_avg.emb.t"), 0u);
  EXPECT_EQ(state.count("exp_avg_sq.emb.t"), 0u);
  EXPECT_EQ(state.count("row_sum.dense.w"), 0u);
  EXPECT_EQ(state.count("exp_avg.dense.w"), 1u);
  const at::Tensor& rowSum = state.at("row_sum.emb.t");
  ASSERT_EQ(rowSum.sizes(), (std::vector<int64_t>{4}));
  EXPECT_EQ(rowSum[0].item<double>(), 0.0);
  EXPECT_EQ(rowSum[2].item<double>(), 0.0);
  EXPECT_NEAR(rowSum[1].item<double>(), s1, 1e-6 * s1);
  EXPECT_NEAR(rowSum[3].item<double>(), s3, 1e-6 * s3);
  EXPECT_EQ(opt->stateOf(0).size(), 1u);  // the table: its row_sum only
  EXPECT_EQ(opt->stateOf(1).size(), 2u);  // the dense weight: exp_avg, exp_avg_sq
}

TEST(SparseOptimizer, SparseAdamKeepsUntouchedRowsAndTheirMoments) {
  at::Tensor table = leaf(torch::tensor({{1., -1.}, {2., 0.5}, {-3., 4.}}));
  at::Tensor before = table.detach().clone();
  auto o = options("sparse_adam");
  o.sparse_weight_decay = 0.02;
  auto opt = ptrain::makeOptimizer(Named{{"emb.t", table}}, o);
  EXPECT_STREQ(opt->name(), "adamw+sparse_adam");

  const double lr = 0.1, b1 = o.beta1, b2 = o.beta2, eps = o.eps, wd = 0.02;
  struct Row {
    double w[2], m[2] = {0, 0}, v[2] = {0, 0};
  };
  Row r0{{1., -1.}}, r2{{-3., 4.}};
  auto adam = [&](Row& r, const double g[2], int t) {
    const double step = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    for (int j = 0; j < 2; ++j) {
      r.w[j] *= 1 - lr * wd;
      r.m[j] = b1 * r.m[j] + (1 - b1) * g[j];
      r.v[j] = b2 * r.v[j] + (1 - b2) * g[j] * g[j];
      r.w[j] -= step * r.m[j] / (std::sqrt(r.v[j]) + eps);
    }
  };
  // Step 1 touches row 0, step 2 row 2 only: row 0 keeps its value and moments.
  table.mutable_grad() = torch::tensor({{1., -2.}, {0., 0.}, {0., 0.}}).to(torch::kFloat);
  opt->step(o.lr);
  const double g0[2] = {1., -2.};
  adam(r0, g0, 1);
  std::map<std::string, at::Tensor> afterOne;
  for (auto& [name, t] : opt->state()) afterOne[name] = t.clone();
  table.mutable_grad() = torch::tensor({{0., 0.}, {0., 0.}, {0.5, 0.25}}).to(torch::kFloat);
  opt->step(o.lr);
  const double g2[2] = {0.5, 0.25};
  adam(r2, g2, 2);

  for (int j = 0; j < 2; ++j) {
    EXPECT_NEAR(at2(table, 0, j), r0.w[j], 1e-6);
    EXPECT_NEAR(at2(table, 2, j), r2.w[j], 1e-6);
  }
  EXPECT_TRUE(torch::equal(table.detach()[1], before[1]));
  const auto named = opt->state();
  std::map<std::string, at::Tensor> state(named.begin(), named.end());
  ASSERT_EQ(state.size(), 2u);
  EXPECT_TRUE(torch::equal(state.at("exp_avg.emb.t")[0], afterOne.at("exp_avg.emb.t")[0]))
      << "row 0's moments wait for its next gradient (dense Adam would decay them)";
  EXPECT_TRUE(torch::equal(state.at("exp_avg_sq.emb.t")[0], afterOne.at("exp_avg_sq.emb.t")[0]));
  EXPECT_NEAR(at2(state.at("exp_avg.emb.t"), 2, 0), r2.m[0], 1e-7);
  EXPECT_NEAR(at2(state.at("exp_avg_sq.emb.t"), 2, 1), r2.v[1], 1e-9);
  EXPECT_EQ(state.at("exp_avg.emb.t")[1].abs().sum().item<double>(), 0.0);
}

TEST(SparseOptimizer, StateRoundTripsThroughLoad) {
  auto make = [](at::Tensor& table, at::Tensor& bias) {
    table = leaf(torch::arange(12).reshape({6, 2}));
    bias = leaf(torch::zeros({2}));
    return ptrain::makeOptimizer(Named{{"emb.row_wise.user", table}, {"head.bias", bias}},
                                 options("rowwise_adagrad"));
  };
  at::Tensor t1, b1, t2, b2;
  auto a = make(t1, b1);
  auto b = make(t2, b2);
  for (int step = 0; step < 3; ++step) {
    t1.mutable_grad() = torch::zeros({6, 2});
    t1.mutable_grad()[step].fill_(1.0 + step);
    b1.mutable_grad() = torch::ones({2});
    a->step(0.01);
  }
  std::map<std::string, at::Tensor> saved;
  for (auto& [name, t] : a->state()) saved[name] = t.clone();
  EXPECT_EQ(saved.size(), 3u);  // row_sum of the table, exp_avg and exp_avg_sq of the bias
  b->load(saved, a->stepCount());
  EXPECT_EQ(b->stepCount(), 3);
  for (auto& [name, t] : b->state()) EXPECT_TRUE(torch::equal(t, saved.at(name))) << name;

  saved["row_sum.emb.row_wise.user"] = torch::zeros({5});
  EXPECT_THROW(b->load(saved, 3), ptrain::CheckpointError);
}

template <typename Fn>
std::string configErrorOf(Fn fn) {
  try {
    fn();
  } catch (const ptrain::ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

TEST(SparseOptimizer, BadSettingsAreConfigErrors) {
  at::Tensor table = leaf(torch::zeros({4, 2}));
  at::Tensor vector = leaf(torch::zeros({4}));
  auto o = options("adagrad");
  EXPECT_EQ(configErrorOf([&] { ptrain::makeOptimizer(Named{{"emb.t", table}}, o); }),
            "optimizer.sparse_name: 'adagrad' is not a sparse optimizer; use none, rowwise_adagrad or sparse_adam");
  o = options("rowwise_adagrad");
  o.name = "sgd";
  EXPECT_EQ(configErrorOf([&] { ptrain::makeOptimizer(Named{{"emb.t", table}}, o); }),
            "optimizer.sparse_name rowwise_adagrad updates the tables beside adamw, not sgd; set optimizer.name to "
            "adamw");
  o = options("rowwise_adagrad");
  EXPECT_EQ(configErrorOf([&] { ptrain::makeOptimizer(Named{{"emb.v", vector}}, o); }),
            "optimizer.sparse_name rowwise_adagrad: 'emb.v' is not a table of rows (shape [4]); sparse rows need 2-d "
            "parameters (and not optimizer.distributed, which flattens them)");
  // Outside the prefixes a vector is a dense parameter like any other.
  EXPECT_NO_THROW(ptrain::makeOptimizer(Named{{"head.v", vector}}, o));
  EXPECT_TRUE(o.isSparse("emb.t"));
  EXPECT_FALSE(o.isSparse("embedding.t"));
  o.sparse_name = "none";
  EXPECT_FALSE(o.isSparse("emb.t"));
}

// Three steps of a table and a dense weight with rows 0..2 touched in turn.
std::map<std::string, at::Tensor> threeSteps(const std::string& sparse, at::ScalarType dtype, bool observed) {
  at::Tensor table = (torch::arange(20).reshape({5, 4}) * 0.1).to(dtype).requires_grad_(true);
  at::Tensor dense = (torch::arange(6).reshape({2, 3}) * 0.2).to(dtype).requires_grad_(true);
  auto o = options(sparse);
  o.master_weights = dtype != torch::kFloat;
  auto opt = ptrain::makeOptimizer(Named{{"emb.t", table}, {"dense.w", dense}}, o);
  std::vector<std::pair<size_t, bool>> calls;
  if (observed) opt->update_observer = [&](size_t i, bool done) { calls.emplace_back(i, done); };
  for (int step = 0; step < 3; ++step) {
    at::Tensor g = torch::zeros({5, 4});
    g[step] = torch::tensor({1.0, -0.5, 0.25, 2.0}) * (step + 1);
    table.mutable_grad() = g.to(dtype);
    dense.mutable_grad() = torch::full({2, 3}, 0.3 * (step + 1)).to(dtype);
    opt->step(o.lr, 0.8);
  }
  if (observed) {
    EXPECT_EQ(calls.size(), 12u);  // before and after each of 2 parameters, 3 steps
  }
  std::map<std::string, at::Tensor> out{{"table", table.detach().clone()}, {"dense", dense.detach().clone()}};
  for (auto& [name, t] : opt->state()) out[name] = t.clone();
  return out;
}

TEST(SparseOptimizer, MastersAndTheObservedPathGiveTheSameRows) {
  for (const char* sparse : {"rowwise_adagrad", "sparse_adam"}) {
    const auto plain = threeSteps(sparse, torch::kFloat, false);
    const auto observed = threeSteps(sparse, torch::kFloat, true);
    for (const auto& [name, t] : plain) EXPECT_TRUE(torch::equal(t, observed.at(name))) << sparse << " " << name;

    const auto bf16 = threeSteps(sparse, torch::kBFloat16, false);
    ASSERT_EQ(bf16.count("master.emb.t"), 1u);
    const at::Tensor& master = bf16.at("master.emb.t");
    EXPECT_TRUE(torch::equal(bf16.at("table"), master.to(torch::kBFloat16))) << "the table is its rounded master";
    // Rows 3 and 4 never had a gradient: bitwise their initial values.
    at::Tensor initial = (torch::arange(20).reshape({5, 4}) * 0.1).to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(bf16.at("table").narrow(0, 3, 2), initial.narrow(0, 3, 2))) << sparse;
    // The float32 master follows the float32 run up to the bf16 start values.
    EXPECT_LT((master.narrow(0, 0, 3) - plain.at("table").narrow(0, 0, 3)).abs().max().item<double>(), 2e-2)
        << sparse;
  }
}

}  // namespace

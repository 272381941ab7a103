// Embedding tables sharded over the tensor-parallel group (nn/embedding_tables.h)
// on real ranks (forked processes, Gloo over 127.0.0.1), against the same
// module on one rank:
//   - the sharding plan: row-wise by size, table-wise tables balanced into
//     slots, owners at every tp, all independent of tp;
//   - initial values: a function of (seed, table, row), whatever rows are built;
//   - one rank: each table is torch's embedding, -1 reads zeros, pooled bags;
//   - tp {1, 2, 4}, sharded by applyTensorParallel: outputs of forward, lookup
//     and pooled lookups within 1e-6, and each rank's gradient = its slice of
//     the full gradient (row-wise ranges, table-wise slots on their owner);
//     a module built with only its rank's rows equal to the slices, with the
//     same splits in the placement;
//   - 20 steps of tables + a dense head under AdamW with row-wise Adagrad and
//     with sparse Adam at tp {2, 4} equal to one rank within 1e-5;
//   - a checkpoint gathered at tp 2 along each placement's split (as the engine
//     saves it) and loaded at tp 4 and tp 1, weights and optimizer state,
//     continuing as the uninterrupted single-rank run;
//   - through ModelRuntime (the tensor and data plugins, clipping by the global
//     norm, the engine's checkpoint gather and load): tp 2 x dp 2 for 6 steps,
//     saved, resumed at tp 4 and at one rank for 4 more, every loss within
//     1e-5 of the uninterrupted single-rank run, and the final tables too
//     (also with the tp 4 model built shard by shard), and reshardParameters
//     from tp 2 x dp 2 into tp 4 in memory;
//   - bad settings refused with ConfigError.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "checkpoint_fixture.h"
#include "ptrain/comm/backend.h"
#include "ptrain/comm/communicator.h"
#include "ptrain/comm/rank_env.h"
#include "ptrain/comm/process_group.h"
#include "ptrain/comm/store.h"
#include "ptrain/core/logging.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/optimizer.h"
#include "ptrain/nn/parameter_seed.h"
#include "ptrain/engine/reshard.h"
#include "ptrain/engine/runtime.h"
#include "ptrain/engine/safetensors.h"
#include "ptrain/engine/tensor_parallel.h"
#include "ptrain/nn/embedding_tables.h"
#include "ptrain/nn/tp_comm.h"
#include "ptrain/plugin/registry.h"
#include "support/test_support.h"

namespace nn = ptrain::nn;
using nn::TensorParallelState;

namespace {

// One forked rank's Gloo group over all ranks of the test.
class GlooRank {
 public:
  GlooRank(int rank, int size, int port) {
    // Ranks share two cores: one intra-op thread each.
    at::set_num_threads(1);
    registry_ = std::make_unique<ptrain::PluginRegistry>(
        std::vector<std::string>{ptrain::test::binaryDir() + "/lib/ptrain/plugins/comm/libptrain_comm_gloo.so"});
    ptrain::PluginContext ctx;
    ctx.logger = ptrain::logger();
    ctx.rank = rank;
    ctx.world_size = size;
    plugin_ = registry_->create(ptrain::plugin_kind::kComm, "gloo", ctx);
    ptrain::TcpStoreOptions so;
    so.port = port;
    so.is_server = rank == 0;
    so.world_size = size;
    so.timeout = std::chrono::seconds(30);
    store_ = ptrain::createTcpStore(so);
    ptrain::GroupOptions go;
    go.name = "tp";
    for (int r = 0; r < size; ++r) go.ranks.push_back(r);
    go.global_rank = rank;
    go.timeout = std::chrono::seconds(30);
    group_ = static_cast<ptrain::CommBackend*>(plugin_.get())->createGroup(store_, go);
  }
  ~GlooRank() {
    group_->barrier()->wait();
    group_.reset();
  }
  std::shared_ptr<ptrain::ProcessGroup> group() const { return group_; }

 private:
  std::unique_ptr<ptrain::PluginRegistry> registry_;
  std::unique_ptr<ptrain::Plugin> plugin_;
  std::shared_ptr<ptrain::Store> store_;
  std::shared_ptr<ptrain::ProcessGroup> group_;
};

// Runs body(state) on `size` forked ranks (size 1: in this process, with a
// state of one rank); fails the test if any rank fails.
void onRanks(int size, const std::function<void(std::shared_ptr<TensorParallelState>)>& body) {
  if (size == 1) {
    auto one = std::make_shared<TensorParallelState>();
    body(one);
    return;
  }
  std::string failures = ptrain::test::runRanks(
      size,
      [&](int rank, int n, int port) {
        GlooRank gloo(rank, n, port);
        body(TensorParallelState::create(gloo.group(), false));
      },
      120);
  EXPECT_EQ(failures, "") << "tp=" << size;
}

void expectClose(const at::Tensor& actual, const at::Tensor& expected, const std::string& what, double tol) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  if (actual.numel() == 0) return;
  const double err = (actual.to(torch::kFloat64) - expected.to(torch::kFloat64)).abs().max().item<double>();
  const double scale = std::max(1.0, expected.abs().max().item<double>());
  EXPECT_LE(err, tol * scale) << what << ": max abs error " << err;
}

// Tables of both kinds at threshold 32: user and item row-wise (rows that
// 4 divides), five small ones packed into 4 slots (each of the 4 ranks at tp 4
// owns one slot).
nn::EmbeddingTablesOptions testOptions() {
  nn::EmbeddingTablesOptions o;
  o.tables = {{"user", 40}, {"item", 64}, {"cat", 12}, {"a", 7}, {"b", 5}, {"c", 30}, {"d", 3}};
  o.dim = 6;
  o.row_wise_threshold = 32;
  o.table_wise_slots = 4;
  o.seed = 11;
  o.init_bound = 0.5;
  return o;
}

// Ids [batch, tables] drawn from `seed`, a few -1, and an item history
// [batch, 5] with -1 padding (row 0 without history).
struct TestIds {
  at::Tensor ids;
  at::Tensor history;
};

TestIds idsOf(const nn::EmbeddingTablesOptions& o, int64_t batch, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> columns;
  for (const auto& t : o.tables) columns.push_back(torch::randint(t.rows, {batch}, torch::kInt64));
  TestIds out;
  out.ids = torch::stack(columns, 1);
  out.ids.index_put_({0, 2}, -1);
  at::Tensor hist = torch::randint(64, {batch, 5}, torch::kInt64);
  at::Tensor lengths = torch::randint(0, 6, {batch, 1}, torch::kInt64);
  lengths.index_put_({0, 0}, 0);
  out.history = hist.masked_fill(torch::arange(5).unsqueeze(0) >= lengths, -1);
  return out;
}

// A StagedModel around the tables, so that applyTensorParallel shards them
// from their plan as the tensor plugin does, plus a dense head (replicated).
class TablesModel : public ptrain::StagedModel {
 public:
  struct Root : torch::nn::Module {
    explicit Root(const nn::EmbeddingTablesOptions& o) {
      emb = register_module("emb", nn::EmbeddingTables(o));
      torch::manual_seed(5);
      head = register_module("head", torch::nn::Linear(o.dim * 3, 1));
    }
    nn::EmbeddingTables emb{nullptr};
    torch::nn::Linear head{nullptr};
  };
  explicit TablesModel(const nn::EmbeddingTablesOptions& o) { root_ = std::make_shared<Root>(o); }
  torch::nn::Module& module() override { return *root_; }
  int numBlocks() const override { return 0; }
  std::string blockPrefix(int) const override { return ""; }
  std::vector<std::string> embedPrefixes() const override { return {"emb."}; }
  std::vector<std::string> headPrefixes() const override { return {"head."}; }
  at::Tensor embed(const ptrain::Batch&) override { return {}; }
  at::Tensor runBlock(int, const at::Tensor& h) override { return h; }
  ptrain::LossOutput head(const at::Tensor&, const ptrain::Batch&) override { return {}; }
  ptrain::TensorParallelPlan tensorParallelPlan() override { return {{{"emb.", root_->emb.get()}}, {}}; }
  void setTensorParallel(std::shared_ptr<const TensorParallelState> state) override {
    // When built sharded: the splits the tables made.
    const auto& o = root_->emb->options();
    nn::recordBuiltShards(*this, "emb.", root_->emb->builtShards(), o.shard_count, o.shard_rank);
    state_ = std::move(state);
  }

  // Click logit of each row: sum-pooled fields, item history (mean) and the
  // target item's lookups in one all-reduce, through the dense head.
  at::Tensor logits(const TestIds& in) {
    nn::EmbeddingTablesImpl& emb = *root_->emb;
    at::Tensor fields = emb.forward(in.ids);  // [B, N, D]
    auto outs = emb.lookups({{1, in.history, true, nn::Pooling::kMean}, {1, in.ids.select(1, 1), false}});
    at::Tensor x = torch::cat({fields.sum(1), outs[0], outs[0] * outs[1]}, 1);
    return root_->head(x).squeeze(1);
  }

  std::shared_ptr<Root> root_;
  std::shared_ptr<const TensorParallelState> state_;
};

// A fixed upstream gradient for [B, N, D] outputs.
at::Tensor weightsFor(at::IntArrayRef shape, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn(shape);
}

TEST(EmbeddingShardingPlan, PlacesBySizeAndBalancesSlotsIndependentlyOfTp) {
  const auto o = testOptions();
  const auto plan = nn::EmbeddingShardingPlan::of(o);
  ASSERT_EQ(plan.tables.size(), 7u);
  EXPECT_EQ(plan.tables[0].sharding, nn::TableSharding::kRowWise);
  EXPECT_EQ(plan.tables[0].parameter, "row_wise.user");
  EXPECT_EQ(plan.tables[1].parameter, "row_wise.item");
  // Largest first into the emptiest slot: c (30) -> 0, cat (12) -> 1, a (7)
  // -> 2, b (5) -> 3, d (3) -> 3; every slot as tall as the fullest (30).
  EXPECT_EQ(plan.slot_rows, 30);
  const std::vector<int64_t> slots{-1, -1, 1, 2, 3, 0, 3};
  const std::vector<int64_t> firstRows{0, 0, 30, 60, 90, 0, 95};
  for (size_t t = 2; t < 7; ++t) {
    EXPECT_EQ(plan.tables[t].sharding, nn::TableSharding::kTableWise) << t;
    EXPECT_EQ(plan.tables[t].parameter, "table_wise");
    EXPECT_EQ(plan.tables[t].slot, slots[t]) << t;
    EXPECT_EQ(plan.tables[t].first_row, firstRows[t]) << t;
  }
  EXPECT_EQ(plan.ownerOf(6, 1), 0);
  EXPECT_EQ(plan.ownerOf(6, 2), 1);
  EXPECT_EQ(plan.ownerOf(6, 4), 3);
  EXPECT_EQ(plan.ownerOf(2, 4), 1);
  EXPECT_EQ(plan.ownerOf(0, 4), -1);
  // (40 + 64) / tp row-wise rows and 4 / tp slots of 30 rows, times 6.
  EXPECT_EQ(nn::embeddingParametersPerRank(o, 1), (104 + 120) * 6);
  EXPECT_EQ(nn::embeddingParametersPerRank(o, 4), (26 + 30) * 6);

  const auto lines = nn::describeEmbeddingSharding(o, 2);
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[0], "user: row-wise, 40 rows, 20 per rank");
  EXPECT_EQ(lines[6], "d: table-wise, 3 rows, slot 3 on rank 1");

  auto allRowWise = o;
  allRowWise.row_wise_threshold = 0;
  EXPECT_FALSE(nn::EmbeddingShardingPlan::of(allRowWise).hasTableWise());
  auto padded = o;
  padded.row_multiple = 16;
  EXPECT_EQ(nn::EmbeddingShardingPlan::of(padded).padded_rows[0], 48);
  EXPECT_EQ(nn::EmbeddingShardingPlan::of(padded).padded_rows[1], 64);
}

TEST(EmbeddingTables, InitialRowsArePureFunctionsOfSeedTableAndRow) {
  at::Tensor all = torch::empty({50, 4});
  nn::fillEmbeddingRows(all, 123, 0, 0.25);
  at::Tensor some = torch::empty({10, 4});
  nn::fillEmbeddingRows(some, 123, 20, 0.25);
  EXPECT_TRUE(torch::equal(some, all.narrow(0, 20, 10)));
  EXPECT_LE(all.abs().max().item<double>(), 0.25);
  EXPECT_NEAR(all.mean().item<double>(), 0.0, 0.05);
  at::Tensor other = torch::empty({50, 4});
  nn::fillEmbeddingRows(other, 124, 0, 0.25);
  EXPECT_FALSE(torch::equal(other, all));

  // The module draws each table from parameterSeed(seed, name), padding zero.
  auto o = testOptions();
  o.row_multiple = 16;
  o.init_bound = 0;
  nn::EmbeddingTables tables(o);
  at::Tensor user = torch::empty({40, 6});
  nn::fillEmbeddingRows(user, ptrain::parameterSeed(11, "user"), 0, std::sqrt(1.0 / 40));
  EXPECT_TRUE(torch::equal(tables->row_wise[0].narrow(0, 0, 40), user));
  EXPECT_EQ(tables->row_wise[0].size(0), 48);
  EXPECT_EQ(tables->row_wise[0].narrow(0, 40, 8).abs().sum().item<double>(), 0.0);
  at::Tensor d = torch::empty({3, 6});
  nn::fillEmbeddingRows(d, ptrain::parameterSeed(11, "d"), 0, std::sqrt(1.0 / 3));
  EXPECT_TRUE(torch::equal(tables->table_wise.narrow(0, 95, 3), d));
}

TEST(EmbeddingTables, OneRankLooksUpEachTableAsTorchEmbedding) {
  const auto o = testOptions();
  nn::EmbeddingTables tables(o);
  std::map<std::string, at::Tensor> full;
  for (const auto& p : tables->named_parameters()) full[p.key()] = p.value().detach();
  ASSERT_EQ(full.size(), 3u);  // row_wise.user, row_wise.item, table_wise

  const TestIds in = idsOf(o, 9, 3);
  torch::NoGradGuard noGrad;
  at::Tensor out = tables->forward(in.ids);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{9, 7, 6}));
  for (int64_t t = 0; t < 7; ++t) {
    at::Tensor table = tables->tableFromFull(o.tables[t].name, full, "");
    at::Tensor ids = in.ids.select(1, t);
    at::Tensor expected = torch::embedding(table, ids.clamp_min(0)) * (ids >= 0).unsqueeze(1);
    EXPECT_TRUE(torch::equal(out.select(1, t), expected)) << o.tables[t].name;
  }
  EXPECT_EQ(out.select(1, 2)[0].abs().sum().item<double>(), 0.0) << "-1 reads zeros";

  at::Tensor item = tables->tableFromFull("item", full, "");
  at::Tensor rows = tables->lookup(1, in.history);  // [9, 5, 6]
  at::Tensor valid = (in.history >= 0).unsqueeze(2).to(torch::kFloat);
  expectClose(rows, torch::embedding(item, in.history.clamp_min(0)) * valid, "history rows", 0);
  expectClose(tables->pooled(1, in.history, nn::Pooling::kSum), rows.sum(1), "sum pooling", 1e-7);
  at::Tensor count = valid.sum(1).clamp_min(1);
  expectClose(tables->pooled(1, in.history, nn::Pooling::kMean), rows.sum(1) / count, "mean pooling", 1e-7);
  EXPECT_EQ(tables->pooled(1, in.history, nn::Pooling::kMean)[0].abs().sum().item<double>(), 0.0)
      << "an empty bag pools to zeros";
  EXPECT_THROW(tables->lookup(0, torch::tensor({3, 40})), ptrain::InternalError) << "user has 40 rows";
  EXPECT_THROW(tables->lookup(3, torch::tensor({-2})), ptrain::InternalError);
  EXPECT_THROW(tables->lookup(0, torch::tensor({1.0})), ptrain::InternalError) << "ids are int64";
}

class EmbeddingTpSizes : public ::testing::TestWithParam<int> {};

TEST_P(EmbeddingTpSizes, ShardedTablesMatchOneRankForwardAndGradients) {
  const int n = GetParam();
  onRanks(n, [n](std::shared_ptr<TensorParallelState> tp) {
    const auto o = testOptions();
    const TestIds in = idsOf(o, 8, 21);

    TablesModel full(o);
    at::Tensor refFields = full.root_->emb->forward(in.ids);
    at::Tensor refRows = full.root_->emb->lookup(1, in.history);
    at::Tensor refPooled = full.root_->emb->pooled(4, in.ids.narrow(1, 0, 4).clamp_max(4), nn::Pooling::kSum);
    at::Tensor w1 = weightsFor(refFields.sizes(), 1), w2 = weightsFor(refRows.sizes(), 2),
               w3 = weightsFor(refPooled.sizes(), 3);
    ((refFields * w1).sum() + (refRows * w2).sum() + (refPooled * w3).sum()).backward();

    TablesModel model(o);
    nn::applyTensorParallel(model, tp);
    const auto& placement = model.placement;
    if (n > 1) {
      for (const char* name : {"emb.row_wise.user", "emb.row_wise.item", "emb.table_wise"}) {
        const ptrain::ShardSpec* spec = placement.of(name).shardAlong(ptrain::GroupKind::kTensor);
        ASSERT_NE(spec, nullptr) << name;
        EXPECT_EQ(spec->dim, 0);
        EXPECT_EQ(spec->num_shards, n);
        EXPECT_EQ(spec->index, tp->rank);
      }
      EXPECT_EQ(placement.of("emb.table_wise").shardAlong(ptrain::GroupKind::kTensor)->full_size, 120);
      EXPECT_EQ(model.root_->emb->table_wise.size(0), 120 / n);
    }
    // Built sharded: the same rows and splits, without a full table.
    auto shardOptions = o;
    shardOptions.shard_rank = tp->rank;
    shardOptions.shard_count = n;
    TablesModel built(shardOptions);
    EXPECT_TRUE(built.root_->emb->splitParameters().empty() || n == 1);
    nn::applyTensorParallel(built, tp);
    auto sliced = model.module().named_parameters();
    for (const auto& p : built.module().named_parameters()) {
      EXPECT_TRUE(torch::equal(p.value(), sliced[p.key()])) << p.key() << " built sharded";
      const auto& a = built.placement.of(p.key()).shards;
      const auto& b = placement.of(p.key()).shards;
      ASSERT_EQ(a.size(), b.size()) << p.key();
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].dim, b[i].dim);
        EXPECT_EQ(a[i].num_shards, b[i].num_shards);
        EXPECT_EQ(a[i].index, b[i].index);
        EXPECT_EQ(a[i].full_size, b[i].full_size) << p.key();
      }
    }

    at::Tensor fields = model.root_->emb->forward(in.ids);
    at::Tensor rows = model.root_->emb->lookup(1, in.history);
    at::Tensor pooled = model.root_->emb->pooled(4, in.ids.narrow(1, 0, 4).clamp_max(4), nn::Pooling::kSum);
    expectClose(fields, refFields, "fields", 1e-6);
    expectClose(rows, refRows, "history rows", 1e-6);
    expectClose(pooled, refPooled, "pooled", 1e-6);
    ((fields * w1).sum() + (rows * w2).sum() + (pooled * w3).sum()).backward();

    auto refParams = full.module().named_parameters();
    for (const auto& p : model.module().named_parameters()) {
      if (p.key().rfind("emb.", 0) != 0) continue;
      at::Tensor expected = placement.of(p.key()).sliceOfFull(refParams[p.key()].grad(), p.key());
      ASSERT_TRUE(p.value().grad().defined()) << p.key() << " on rank " << tp->rank;
      expectClose(p.value().grad(), expected, "grad of " + p.key(), 1e-6);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(EmbeddingTablesTp, EmbeddingTpSizes, ::testing::Values(1, 2, 4));

// ---- training with the sparse optimizers ----

ptrain::OptimizerOptions sparseOptions(const std::string& sparse) {
  ptrain::OptimizerOptions o;
  o.lr = 0.01;
  o.sparse_name = sparse;
  o.sparse_prefixes = {"emb."};
  o.sparse_lr = 0.05;
  o.sparse_weight_decay = sparse == "sparse_adam" ? 0.01 : 0.001;
  return o;
}

// Step `step`'s batch: labels from a fixed rule of the ids.
TestIds batchOf(const nn::EmbeddingTablesOptions& o, int step) { return idsOf(o, 16, 1000 + step); }

at::Tensor labelsOf(const TestIds& in) { return (in.ids.select(1, 0).remainder(3) == 0).to(torch::kFloat); }

// `steps` steps of the model under `optimizer`, starting at step `first`.
void train(TablesModel& model, ptrain::Optimizer& optimizer, const nn::EmbeddingTablesOptions& o, int first,
           int steps, double lr) {
  for (int s = first; s < first + steps; ++s) {
    const TestIds in = batchOf(o, s);
    at::Tensor loss = torch::binary_cross_entropy_with_logits(model.logits(in), labelsOf(in));
    optimizer.zeroGrad();
    loss.backward();
    optimizer.step(lr);
  }
}

class SparseTraining : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(SparseTraining, TwentyStepsOfShardedTablesMatchOneRank) {
  const int n = std::get<0>(GetParam());
  const std::string sparse = std::get<1>(GetParam());
  onRanks(n, [&](std::shared_ptr<TensorParallelState> tp) {
    const auto o = testOptions();
    const auto options = sparseOptions(sparse);

    TablesModel full(o);
    auto refOptimizer = ptrain::makeOptimizer(full.localParameters(), options);
    train(full, *refOptimizer, o, 0, 20, options.lr);

    TablesModel model(o);
    nn::applyTensorParallel(model, tp);
    auto optimizer = ptrain::makeOptimizer(model.localParameters(), options);
    EXPECT_EQ(std::string(optimizer->name()), "adamw+" + sparse);
    train(model, *optimizer, o, 0, 20, options.lr);

    auto refParams = full.module().named_parameters();
    TablesModel fresh(o);
    auto freshParams = fresh.module().named_parameters();
    for (const auto& p : model.module().named_parameters()) {
      at::Tensor expected = model.placement.of(p.key()).sliceOfFull(refParams[p.key()], p.key());
      expectClose(p.value(), expected, p.key() + " after 20 steps", 1e-5);
      EXPECT_FALSE(torch::equal(refParams[p.key()], freshParams[p.key()])) << p.key() << " trained";
    }
    // The optimizer state, sliced the same way.
    std::map<std::string, at::Tensor> refState;
    for (auto& [name, t] : refOptimizer->state()) refState[name] = t;
    for (auto& [name, t] : optimizer->state()) {
      const std::string param = name.substr(name.find('.') + 1);
      ASSERT_EQ(refState.count(name), 1u) << name;
      expectClose(t, model.placement.of(param).sliceOfFull(refState[name], param), "state " + name, 1e-5);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(EmbeddingTablesTp, SparseTraining,
                         ::testing::Combine(::testing::Values(2, 4),
                                            ::testing::Values(std::string("rowwise_adagrad"),
                                                              std::string("sparse_adam"))));

// ---- checkpoints ----

// Every parameter and optimizer state gathered full-size along its placement's
// tensor split, as the engine's checkpoint does (runtime.cpp: unshard).
std::map<std::string, at::Tensor> gatherFull(TablesModel& model, ptrain::Optimizer& optimizer,
                                             const TensorParallelState& tp) {
  std::map<std::string, at::Tensor> out;
  auto gather = [&](const std::string& param, const at::Tensor& t) {
    const ptrain::ShardSpec* spec = model.placement.of(param).shardAlong(ptrain::GroupKind::kTensor);
    return spec ? nn::allGatherAlong(t.detach(), tp, spec->dim) : t.detach().clone();
  };
  for (const auto& p : model.module().named_parameters()) out["param." + p.key()] = gather(p.key(), p.value());
  for (auto& [name, t] : optimizer.state()) out["state." + name] = gather(name.substr(name.find('.') + 1), t);
  return out;
}

// Loads `full` (gatherFull's names) into a model sharded for its placement.
void loadFull(TablesModel& model, ptrain::Optimizer& optimizer, const std::map<std::string, at::Tensor>& full,
              int64_t steps) {
  torch::NoGradGuard noGrad;
  for (auto& p : model.module().named_parameters()) {
    p.value().copy_(model.placement.of(p.key()).sliceOfFull(full.at("param." + p.key()), p.key()));
  }
  std::map<std::string, at::Tensor> state;
  for (const auto& [name, t] : full) {
    if (name.rfind("state.", 0) != 0) continue;
    const std::string key = name.substr(6);
    const std::string param = key.substr(key.find('.') + 1);
    state[key] = model.placement.of(param).sliceOfFull(t, param).contiguous();
  }
  optimizer.load(state, steps);
}

TEST(EmbeddingTablesCheckpoint, SavedAtTp2ResumesAtTp4AndTp1AsOneRank) {
  const auto o = testOptions();
  const auto options = sparseOptions("rowwise_adagrad");
  ptrain::test::TempDir dir;
  const std::string file = dir.path() + "/tables.safetensors";

  onRanks(2, [&](std::shared_ptr<TensorParallelState> tp) {
    TablesModel model(o);
    nn::applyTensorParallel(model, tp);
    auto optimizer = ptrain::makeOptimizer(model.localParameters(), options);
    train(model, *optimizer, o, 0, 6, options.lr);
    auto full = gatherFull(model, *optimizer, *tp);
    if (tp->rank == 0) {
      std::vector<std::pair<std::string, at::Tensor>> entries(full.begin(), full.end());
      ptrain::saveSafetensors(file, entries, {});
    }
  });

  // The uninterrupted run on one rank: 6 steps, then 4 more.
  TablesModel ref(o);
  auto refOptimizer = ptrain::makeOptimizer(ref.localParameters(), options);
  train(ref, *refOptimizer, o, 0, 6, options.lr);
  ptrain::SafetensorsFile saved = ptrain::loadSafetensors(file);
  std::map<std::string, at::Tensor> full(saved.tensors.begin(), saved.tensors.end());
  // The saved tables are the single-rank run's, table by table.
  std::map<std::string, at::Tensor> fullParams;
  for (const auto& [name, t] : full) {
    if (name.rfind("param.emb.", 0) == 0) fullParams[name.substr(10)] = t;
  }
  for (const auto& spec : o.tables) {
    std::map<std::string, at::Tensor> refFull;
    for (const auto& p : ref.root_->emb->named_parameters()) refFull[p.key()] = p.value().detach();
    expectClose(ref.root_->emb->tableFromFull(spec.name, fullParams, ""),
                ref.root_->emb->tableFromFull(spec.name, refFull, ""), "saved table " + spec.name, 1e-5);
  }
  train(ref, *refOptimizer, o, 6, 4, options.lr);

  for (int n : {4, 1}) {
    onRanks(n, [&](std::shared_ptr<TensorParallelState> tp) {
      TablesModel model(o);
      nn::applyTensorParallel(model, tp);
      auto optimizer = ptrain::makeOptimizer(model.localParameters(), options);
      loadFull(model, *optimizer, full, 6);
      train(model, *optimizer, o, 6, 4, options.lr);
      auto refParams = ref.module().named_parameters();
      for (const auto& p : model.module().named_parameters()) {
        at::Tensor expected = model.placement.of(p.key()).sliceOfFull(refParams[p.key()], p.key());
        expectClose(p.value(), expected, p.key() + " resumed at tp " + std::to_string(n), 1e-5);
      }
    });
  }
}

// ---- bad settings ----

template <typename Fn>
std::string configErrorOf(Fn fn) {
  try {
    fn();
  } catch (const ptrain::ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

TEST(EmbeddingTables, BadSettingsAreConfigErrors) {
  nn::EmbeddingTablesOptions o;
  o.tables = {{"big", 40}, {"tiny", 3}};
  o.row_wise_threshold = 0;  // both row-wise, and 4 ranks cannot share 3 rows
  EXPECT_EQ(configErrorOf([&] { nn::checkEmbeddingTablesTensorParallel(o, 4); }),
            "embedding table 'tiny' is row-wise with 3 rows, which parallel.tensor_model_parallel_size 4 does not "
            "split into equal ranges; pad its rows to a multiple of 4 (row_multiple) or place it whole on one rank "
            "(a row_wise_threshold above 3)");
  EXPECT_NO_THROW(nn::checkEmbeddingTablesTensorParallel(o, 1));

  auto slots = testOptions();
  slots.table_wise_slots = 6;
  EXPECT_EQ(configErrorOf([&] { nn::checkEmbeddingTablesTensorParallel(slots, 4); }),
            "embedding tables: parallel.tensor_model_parallel_size 4 does not divide table_wise_slots 6, so the "
            "table-wise tables cannot be shared out; use a slot count that 4 divides");
  EXPECT_NO_THROW(nn::checkEmbeddingTablesTensorParallel(slots, 2));

  auto named = testOptions();
  named.tables[1].name = "item.id";
  EXPECT_EQ(configErrorOf([&] { nn::EmbeddingTables t(named); }),
            "embedding tables: table 1 is named 'item.id'; use letters, digits and '_'");
  named.tables[1].name = "user";
  EXPECT_EQ(configErrorOf([&] { nn::EmbeddingTables t(named); }), "embedding tables: two tables are named 'user'");
  auto empty = testOptions();
  empty.tables[3].rows = 0;
  EXPECT_EQ(configErrorOf([&] { nn::EmbeddingTables t(empty); }),
            "embedding tables: table 'a' has 0 rows; every table needs at least 1");
  auto dim = testOptions();
  dim.dim = 0;
  EXPECT_EQ(configErrorOf([&] { nn::EmbeddingTables t(dim); }), "embedding tables: dim 0 must be at least 1");

  // Through applyTensorParallel (the tensor plugin): its own check first.
  TablesModel model(testOptions());
  auto three = std::make_shared<TensorParallelState>();
  three->size = 3;  // no communication happens before the checks
  EXPECT_EQ(configErrorOf([&] { nn::applyTensorParallel(model, three); }),
            "parallel.tensor_model_parallel_size: 3 does not divide emb.row_wise.user (vocab-parallel, size 40 along "
            "dim 0); use a size that divides 40");
}

// ---- through the engine's runtime ----

ptrain::PluginRegistry& registry() {
  static ptrain::PluginRegistry r(ptrain::PluginRegistry::defaultSearchPath({}));
  return r;
}

// The tables (embed), one residual block, a logistic head: the recommender's
// shape in small.
class RecModel : public ptrain::StagedModel {
 public:
  explicit RecModel(const nn::EmbeddingTablesOptions& o) {
    root_ = std::make_shared<torch::nn::Module>();
    emb_ = root_->register_module("emb", nn::EmbeddingTables(o));
    auto blocks = root_->register_module("blocks", std::make_shared<torch::nn::Module>());
    block_ = blocks->register_module("0", torch::nn::Linear(o.dim * 3, o.dim * 3));
    head_ = root_->register_module("head", torch::nn::Linear(o.dim * 3, 1));
  }
  torch::nn::Module& module() override { return *root_; }
  int numBlocks() const override { return 1; }
  std::string blockPrefix(int) const override { return "blocks.0."; }
  std::vector<std::string> embedPrefixes() const override { return {"emb."}; }
  std::vector<std::string> headPrefixes() const override { return {"head."}; }
  at::Tensor embed(const ptrain::Batch& b) override {
    at::Tensor ids = b.at("ids");
    at::Tensor fields = emb_->forward(ids);
    auto outs = emb_->lookups({{1, b.at("history"), true, nn::Pooling::kMean}, {1, ids.select(1, 1), false}});
    return torch::cat({fields.sum(1), outs[0], outs[0] * outs[1]}, 1);
  }
  at::Tensor runBlock(int, const at::Tensor& h) override { return h + torch::tanh(block_(h)); }
  ptrain::LossOutput head(const at::Tensor& h, const ptrain::Batch& b) override {
    at::Tensor logits = head_(h).squeeze(1);
    ptrain::LossOutput out;
    out.loss_sum = torch::binary_cross_entropy_with_logits(logits, b.at("labels"), {}, {}, at::Reduction::Sum);
    out.count = static_cast<double>(b.size());
    return out;
  }
  ptrain::TensorParallelPlan tensorParallelPlan() override { return {{{"emb.", emb_.get()}}, {}}; }
  void setTensorParallel(std::shared_ptr<const TensorParallelState> state) override {
    nn::recordBuiltShards(*this, "emb.", emb_->builtShards(), emb_->options().shard_count,
                          emb_->options().shard_rank);
    state_ = std::move(state);
  }
  // A runtime builds the tables without storage: their rows come from here.
  std::optional<nn::ParameterInit> parameterInit(const std::string& name,
                                                 const std::vector<int64_t>&) const override {
    if (name.rfind("emb.", 0) == 0) return emb_->parameterInit(name.substr(4));
    return std::nullopt;
  }

 private:
  std::shared_ptr<torch::nn::Module> root_;
  nn::EmbeddingTables emb_{nullptr};
  torch::nn::Linear block_{nullptr}, head_{nullptr};
  std::shared_ptr<const TensorParallelState> state_;
};

ptrain::Batch recBatch(const nn::EmbeddingTablesOptions& o, int step) {
  const TestIds in = batchOf(o, step);
  ptrain::Batch b;
  b.tensors.emplace("ids", in.ids);
  b.tensors.emplace("history", in.history);
  b.tensors.emplace("labels", labelsOf(in));
  return b;
}

ptrain::RuntimeOptions recOptions(const ptrain::ParallelLayout& layout) {
  ptrain::RuntimeOptions r;
  r.layout = layout;
  r.seed = 21;
  auto o = sparseOptions("rowwise_adagrad");
  o.clip_grad = 0.5;  // the global norm counts every shard once
  r.optimizer = o;
  return r;
}

// On `layout` (default: the communicator's); `shardBuilt`: the model builds
// only this rank's rows.
std::unique_ptr<ptrain::ModelRuntime> recRuntime(ptrain::Communicator& comm, bool shardBuilt = false,
                                                 std::optional<ptrain::ParallelLayout> layout = std::nullopt) {
  const ptrain::ParallelLayout on = layout.value_or(comm.layout());
  auto o = testOptions();
  if (shardBuilt) {
    o.shard_count = on.tp();
    o.shard_rank = on.indexIn(ptrain::GroupKind::kTensor, comm.rank());
  }
  return std::make_unique<ptrain::ModelRuntime>(
      comm, registry(), [o](const ptrain::ModelBuild&) { return std::make_shared<RecModel>(o); }, recOptions(on));
}

double recStep(ptrain::ModelRuntime& rt, int step) {
  ptrain::Batch batch = recBatch(testOptions(), step);
  ptrain::StepInput in;
  in.step = step;
  in.micro_batches = rt.microBatches(batch, 4);
  in.loss_divisor = static_cast<double>(batch.size());
  ptrain::StepResult r = rt.step(in);
  EXPECT_TRUE(r.applied);
  return r.loss;
}

std::unique_ptr<ptrain::Communicator> worldOf(int rank, int size, int port, int tp) {
  at::set_num_threads(1);
  ptrain::LayoutSizes sizes;
  sizes.world = size;
  sizes.tp = tp;
  ptrain::RankEnv env;
  env.rank = rank;
  env.world_size = size;
  env.local_rank = rank;
  env.local_world_size = size;
  env.master_port = port;
  ptrain::PluginContext ctx;
  ctx.logger = ptrain::logger();
  ctx.rank = rank;
  ctx.world_size = size;
  ptrain::CommunicatorOptions options;
  options.timeout = std::chrono::seconds(60);
  return std::make_unique<ptrain::Communicator>(env, ptrain::ParallelLayout(sizes), registry(), ctx, options);
}

TEST(EmbeddingTablesRuntime, SavedAtTp2Dp2ResumesAtTp4AndOneRankAsTheUninterruptedRun) {
  ptrain::test::TempDir dir;
  const std::string saved = dir.path() + "/saved", reference = dir.path() + "/reference";
  // The uninterrupted run on one rank: 10 steps.
  std::vector<double> referenceLosses;
  std::map<std::string, at::Tensor> referenceParams;
  {
    auto comm = ptrain::Communicator::loopback();
    auto rt = recRuntime(*comm);
    for (int step = 0; step < 10; ++step) referenceLosses.push_back(recStep(*rt, step));
    referenceParams = ptrain::checkpoint_fixture::wholeTensors(*rt, *comm, reference).parameters;
  }

  std::string failures = ptrain::test::runRanks(4, [&](int rank, int size, int port) {
    auto comm = worldOf(rank, size, port, 2);  // tp 2 x dp 2
    auto rt = recRuntime(*comm);
    for (int step = 0; step < 6; ++step) {
      EXPECT_LT(ptrain::test::relDiff(recStep(*rt, step), referenceLosses[static_cast<size_t>(step)]), 1e-5)
          << "tp 2 x dp 2, step " << step;
    }
    const auto whole = ptrain::checkpoint_fixture::wholeTensors(*rt, *comm, saved).parameters;
    // In memory into a tp 4 runtime of the same ranks, built shard by shard.
    ptrain::LayoutSizes tp4;
    tp4.world = size;
    tp4.tp = 4;
    auto other = recRuntime(*comm, true, ptrain::ParallelLayout(tp4));
    ptrain::reshardParameters(*rt, *other);
    const auto moved =
        ptrain::checkpoint_fixture::wholeTensors(*other, *comm, dir.path() + "/moved-" + std::to_string(port)).parameters;
    for (const auto& [name, t] : whole) {
      EXPECT_TRUE(torch::equal(moved.at(name), t)) << name << " resharded into tp 4";
    }
  });
  ASSERT_EQ(failures, "");

  auto resume = [&](ptrain::Communicator& comm, const std::string& what, bool shardBuilt) {
    auto rt = recRuntime(comm, shardBuilt);
    ptrain::CheckpointReader reader(saved);
    rt->loadCheckpoint(reader, "model", /*withOptimizer=*/true, 6);
    for (int step = 6; step < 10; ++step) {
      EXPECT_LT(ptrain::test::relDiff(recStep(*rt, step), referenceLosses[static_cast<size_t>(step)]), 1e-5)
          << what << ", step " << step;
    }
    const std::string after = dir.path() + "/after-" + what + "-" + std::to_string(comm.worldSize());
    const auto full = ptrain::checkpoint_fixture::wholeTensors(*rt, comm, after).parameters;
    if (comm.rank() != 0) return;
    EXPECT_EQ(full.size(), referenceParams.size());
    for (const auto& [name, t] : referenceParams) expectClose(full.at(name), t, what + ": " + name, 1e-5);
  };
  failures = ptrain::test::runRanks(4, [&](int rank, int size, int port) {
    auto comm = worldOf(rank, size, port, 4);
    resume(*comm, "tp 4", false);
  });
  EXPECT_EQ(failures, "");
  failures = ptrain::test::runRanks(4, [&](int rank, int size, int port) {
    auto comm = worldOf(rank, size, port, 4);
    resume(*comm, "tp 4, built sharded", true);
  });
  EXPECT_EQ(failures, "");
  auto one = ptrain::Communicator::loopback();
  resume(*one, "one rank", false);
}

}  // namespace

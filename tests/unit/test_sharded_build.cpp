// Shard-native builds: a parameter's values are drawn position by position
// (nn/parameter_init.h), so any block drawn alone equals that block of the
// whole draw; layers built under nn::DeferredInit hold no storage until the
// runtime allocates this rank's slice. Checked against the one-rank build of
// every model the trainers use, for every sharded layer type.
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "llm_runtime_fixture.h"
#include "recsys_fixture.h"
#include "ptrain/engine/model.h"
#include "ptrain/nn/deferred_init.h"
#include "ptrain/nn/parallel_layers.h"
#include "ptrain/nn/parameter_init.h"
#include "ptrain/nn/parameter_seed.h"
#include "support/test_support.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"
#include "../../trainers/detection/centernet.h"
#include "../../trainers/detection/detection_trainer.h"
#include "../../trainers/llm/gpt_model.h"
#include "../../trainers/recommender/recommender_trainer.h"
#include "../../trainers/recommender/recsys_model.h"

namespace ptrain {
namespace {

using llm_fixture::layoutOf;
using llm_fixture::registry;
using llm_fixture::worldOf;

at::Tensor whole(const nn::ParameterInit& init, const std::vector<int64_t>& sizes) {
  at::Tensor t = torch::empty(sizes);
  nn::fillShard(t, init, sizes, std::vector<int64_t>(sizes.size(), 0));
  return t;
}

// The block of `full` at `offsets` with `sizes`.
at::Tensor blockOf(const at::Tensor& full, const std::vector<int64_t>& offsets, at::IntArrayRef sizes) {
  at::Tensor out = full;
  for (size_t d = 0; d < offsets.size(); ++d) out = out.narrow(static_cast<int64_t>(d), offsets[d], sizes[d]);
  return out;
}

TEST(ParameterInit, AnyBlockDrawnAloneEqualsThatBlockOfTheWholeDraw) {
  const std::vector<int64_t> sizes{7, 5, 6};
  for (const auto& init : {nn::ParameterInit::normal(11, 0.5, 2.0), nn::ParameterInit::uniform(12, -3, 1)}) {
    const at::Tensor all = whole(init, sizes);
    torch::manual_seed(1);
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<int64_t> offsets, block;
      for (int64_t s : sizes) {
        const int64_t a = torch::randint(s, {1}).item<int64_t>(), b = torch::randint(s, {1}).item<int64_t>();
        offsets.push_back(std::min(a, b));
        block.push_back(std::max(a, b) - std::min(a, b) + 1);
      }
      at::Tensor part = torch::empty(block);
      nn::fillShard(part, init, sizes, offsets);
      ASSERT_TRUE(torch::equal(part, blockOf(all, offsets, block))) << "block at " << at::IntArrayRef(offsets);
    }
  }
}

// The SDK's helpers a trainer draws with (no libtorch internals): the base
// seed is one draw of the engine-seeded default generator, and a block drawn
// by drawParameter is that block of the whole parameter.
TEST(ParameterInit, DrawParameterAndModelSeedAsTheEngineSeedsThem) {
  torch::manual_seed(77);
  const uint64_t first = nn::modelSeed();
  torch::manual_seed(77);
  EXPECT_EQ(nn::modelSeed(), first);
  torch::manual_seed(77);
  const uint64_t direct = static_cast<uint64_t>(
      torch::randint(std::numeric_limits<int64_t>::max(), {1}, torch::kInt64).item<int64_t>());
  EXPECT_EQ(first, direct);

  const auto init = nn::ParameterInit::normal(parameterSeed(first, "blocks.0.fc.weight"), 0.0, 0.02);
  const at::Tensor all = nn::drawParameter(init, {12, 8});
  EXPECT_EQ(all.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(all, whole(init, {12, 8})));
  // Rank 1 of a 3-way row split, drawn alone.
  EXPECT_TRUE(torch::equal(nn::drawParameter(init, {12, 8}, {4, 0}, {4, 8}), all.narrow(0, 4, 4)));
  EXPECT_THROW(nn::drawParameter(init, {12, 8}, {10, 0}, {4, 8}), InternalError);

  // A generator of one's own: equal seeds, equal streams, apart from the default one.
  at::Generator a = nn::seededGenerator(5), b = nn::seededGenerator(5);
  EXPECT_TRUE(torch::equal(torch::rand({4}, a), torch::rand({4}, b)));
}

TEST(ParameterInit, ValuesDoNotDependOnThreadsAndFollowTheirDistribution) {
  const std::vector<int64_t> sizes{300, 701};
  const auto normal = nn::ParameterInit::normal(3, 0.0, 1.0);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor one = whole(normal, sizes);
  at::set_num_threads(2);
  const at::Tensor two = whole(normal, sizes);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, two));
  EXPECT_NEAR(one.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(one.std().item<double>(), 1.0, 0.01);
  // Neighbours of one Box-Muller pair are not correlated.
  const at::Tensor even = one.view({-1}).slice(0, 0, one.numel(), 2), odd = one.view({-1}).slice(0, 1, one.numel(), 2);
  EXPECT_NEAR((even * odd).mean().item<double>(), 0.0, 0.01);
  const at::Tensor u = whole(nn::ParameterInit::uniform(3, -2, 4), sizes);
  EXPECT_GE(u.min().item<double>(), -2);
  EXPECT_LT(u.max().item<double>(), 4);
  EXPECT_NEAR(u.mean().item<double>(), 1.0, 0.02);
  EXPECT_FALSE(torch::equal(whole(nn::ParameterInit::normal(4, 0.0, 1.0), sizes), one));
}

TEST(ParameterInit, AHalfPrecisionShardIsTheFloatDrawRounded) {
  const auto init = nn::ParameterInit::normal(5, 0.0, 0.02);
  const std::vector<int64_t> sizes{8, 16};
  at::Tensor bf16 = torch::empty(sizes, torch::kBFloat16);
  nn::fillShard(bf16, init, sizes, {0, 0});
  EXPECT_TRUE(torch::equal(bf16, whole(init, sizes).to(torch::kBFloat16)));
}

TEST(ParameterInit, RefusesABlockOutsideTheTensor) {
  at::Tensor t = torch::empty({3, 4});
  EXPECT_THROW(nn::fillShard(t, nn::ParameterInit::constant(1), {4, 4}, {2, 0}), InternalError);
}

TEST(DeferredInit, LayersBuildWithoutStorageOnlyInsideTheGuard) {
  nn::ColumnParallelLinear standalone(64, 128);
  EXPECT_FALSE(nn::isDeferred(standalone->weight));
  EXPECT_GT(standalone->weight.abs().sum().item<double>(), 0);
  nn::DeferredInit deferred;
  nn::ColumnParallelLinear column(4096, 8192);
  nn::RowParallelLinear row(8192, 4096);
  nn::VocabParallelEmbedding vocab(50000, 4096);
  for (const at::Tensor* t : {&column->weight, &column->bias, &row->weight, &vocab->weight}) {
    EXPECT_TRUE(nn::isDeferred(*t));
    EXPECT_EQ(t->storage().nbytes(), 0u);
  }
  EXPECT_EQ(column->weight.sizes(), (std::vector<int64_t>{8192, 4096}));
  EXPECT_FALSE(nn::isDeferred(row->bias));  // replicated: built whole, it is small
  at::Tensor w = column->weight;
  nn::narrowParameter(w, 0, 2048, 2048);
  EXPECT_TRUE(nn::isDeferred(column->weight));  // the same parameter object
  EXPECT_EQ(column->weight.sizes(), (std::vector<int64_t>{2048, 4096}));
}

TEST(DeferredInit, NarrowingAParameterWithStorageCopiesTheSlice) {
  at::Tensor t = torch::arange(12, torch::kFloat32).view({3, 4});
  at::Tensor same = t;
  nn::narrowParameter(t, 1, 1, 2);
  EXPECT_TRUE(torch::equal(same, torch::tensor({{1.f, 2.f}, {5.f, 6.f}, {9.f, 10.f}})));
  EXPECT_TRUE(same.is_contiguous());
}

// ---- every sharded layer type, through the runtime ----

using Factory = std::function<std::shared_ptr<StagedModel>(const ModelBuild&)>;

// On a forked rank: the runtime's model on `layout`, each parameter this rank
// holds equal (bitwise) to its block of the whole model built on one rank from
// the same seed, and a split parameter's storage only its slice.
void expectSlicesOfTheWholeBuild(int rank, int size, int port, const ParallelLayout& layout, const Factory& factory,
                                 size_t minimumSplit) {
  auto comm = worldOf(rank, size, port, layout);
  RuntimeOptions options;
  options.layout = layout;
  options.seed = 7;
  ModelRuntime rt(*comm, registry(), factory, options);
  torch::manual_seed(7);
  auto wholeModel = factory(ModelBuild{});
  auto wholeParams = wholeModel->module().named_parameters();
  size_t split = 0;
  for (const auto& [name, local] : rt.model().localParameters()) {
    const ParameterPlacement& where = rt.model().placement.of(name);
    const at::Tensor* full = wholeParams.find(name);
    ASSERT_NE(full, nullptr) << name;
    ASSERT_EQ(where.fullSizes(local.sizes()), full->sizes().vec()) << name;
    ASSERT_TRUE(torch::equal(local, blockOf(*full, where.offsets(local.sizes()), local.sizes()))) << name;
    if (!where.shards.empty()) {
      ++split;
      EXPECT_EQ(local.storage().nbytes(), static_cast<size_t>(local.numel() * local.element_size())) << name;
    }
  }
  EXPECT_GE(split, minimumSplit);
}

llm::GptConfig gptConfig(int64_t experts) {
  llm::GptConfig c;
  c.vocab_size = 16;
  c.seq_length = 8;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_heads = 4;
  c.tie_embeddings = false;  // the LM head is a column-parallel layer of its own
  c.num_experts = experts;
  if (experts > 0) {
    c.moe.topk = 2;
  }
  return c;
}

struct BuildCase {
  std::string name;
  int tp, ep, etp;
  std::function<Factory()> factory;
  size_t minimumSplit;
};

class ShardedBuild : public ::testing::TestWithParam<BuildCase> {};

TEST_P(ShardedBuild, EveryRanksSlicesEqualTheOneRankBuild) {
  const BuildCase c = GetParam();
  std::string failures = test::runRanks(2, [c](int rank, int size, int port) {
    expectSlicesOfTheWholeBuild(rank, size, port, layoutOf(2, c.tp, 1, c.ep, c.etp), c.factory(), c.minimumSplit);
  });
  EXPECT_EQ(failures, "");
}

using recsys_fixture::tinyConfig;

INSTANTIATE_TEST_SUITE_P(
    Layers, ShardedBuild,
    ::testing::Values(
        // Column (qkv, fc1, LM head), row (proj, fc2) and vocabulary (token embedding) parallel linears.
        BuildCase{"gpt_tp2", 2, 1, 1,
                  [] { return Factory([](const ModelBuild& b) { return std::make_shared<llm::GptModel>(gptConfig(0), b); }); },
                  11},
        // Stacked experts split by expert, and by feature.
        BuildCase{"gpt_moe_ep2", 1, 2, 1,
                  [] { return Factory([](const ModelBuild& b) { return std::make_shared<llm::GptModel>(gptConfig(4), b); }); },
                  8},
        BuildCase{"gpt_moe_etp2", 1, 1, 2,
                  [] { return Factory([](const ModelBuild& b) { return std::make_shared<llm::GptModel>(gptConfig(4), b); }); },
                  6},
        // Column- and row-parallel convolutions, channel-parallel group norms.
        BuildCase{"centernet_tp2", 2, 1, 1,
                  [] {
                    return Factory([](const ModelBuild& b) {
                      detection::CenterNetConfig c;
                      c.num_blocks = 2;
                      return std::make_shared<detection::CenterNetModel>(c, b);
                    });
                  },
                  6},
        // Row-wise tables and the table-wise pack.
        BuildCase{"recsys_tp2", 2, 1, 1,
                  [] {
                    return Factory([](const ModelBuild& b) {
                      return std::make_shared<recommender::RecsysModel>(tinyConfig(0), b);
                    });
                  },
                  3},
        BuildCase{"recsys_ep2", 1, 2, 1,
                  [] {
                    return Factory([](const ModelBuild& b) {
                      return std::make_shared<recommender::RecsysModel>(tinyConfig(4), b);
                    });
                  },
                  4}),
    [](const ::testing::TestParamInfo<BuildCase>& info) { return info.param.name; });

// ---- a model that cannot build a slice is refused ----

// A parallel layer that allocates its weight whole even under DeferredInit.
class WholeColumnImpl : public torch::nn::Module, public nn::ParallelLayer {
 public:
  WholeColumnImpl() { weight = register_parameter("weight", torch::randn({8, 4})); }
  nn::ParallelStyle parallelStyle() const override { return nn::ParallelStyle::kColumn; }
  std::vector<std::pair<std::string, int>> splitParameters() const override { return {{"weight", 0}}; }
  at::Tensor weight;
};
TORCH_MODULE(WholeColumn);

class WholeModel : public StagedModel {
 public:
  WholeModel() : layer(std::make_shared<WholeColumnImpl>()) { root->register_module("layer", layer); }
  torch::nn::Module& module() override { return *root; }
  int numBlocks() const override { return 1; }
  std::string blockPrefix(int) const override { return "layer."; }
  std::vector<std::string> embedPrefixes() const override { return {}; }
  std::vector<std::string> headPrefixes() const override { return {}; }
  at::Tensor embed(const Batch&) override { return {}; }
  at::Tensor runBlock(int, const at::Tensor& h) override { return h; }
  LossOutput head(const at::Tensor&, const Batch&) override { return {}; }
  TensorParallelPlan tensorParallelPlan() override { return {{{"layer.", layer.get()}}, {}}; }
  void setTensorParallel(std::shared_ptr<const nn::TensorParallelState>) override {}

  std::shared_ptr<torch::nn::Module> root = std::make_shared<torch::nn::Module>();
  WholeColumn layer;
};

TEST(ShardedBuildCheck, RefusesALayerThatAllocatesItsWholeTensor) {
  nn::DeferredInit deferred;
  WholeModel model;
  auto problem = checkShardedBuild(model, 2, 1, 1);
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("cannot build a slice of parameter 'layer.weight'"), std::string::npos) << *problem;
  EXPECT_FALSE(checkShardedBuild(model, 1, 1, 1).has_value());
}

TEST(ShardedBuildCheck, TheTrainersModelsBuildSlices) {
  nn::DeferredInit deferred;
  llm::GptModel gpt(gptConfig(4));
  EXPECT_EQ(checkShardedBuild(gpt, 2, 2, 2), std::nullopt);
  detection::CenterNetModel centernet(detection::CenterNetConfig{});
  EXPECT_EQ(checkShardedBuild(centernet, 2, 1, 1), std::nullopt);
  recommender::RecsysModel recsys(tinyConfig(4));
  EXPECT_EQ(checkShardedBuild(recsys, 2, 2, 1), std::nullopt);
}

// ---- data at the share: a rank makes only its rows ----

// Rows [begin, end) made alone equal those rows of the global batch.
void expectRowsOfTheGlobalBatch(Trainer& trainer, int64_t global) {
  for (int64_t step : {0, 3}) {
    const Batch whole = trainer.globalBatch(step, global);
    for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{0, global / 2}, {global / 2, global}, {1, 3}}) {
      const Batch part = trainer.batchRows(step, global, begin, end);
      ASSERT_EQ(part.tensors.size(), whole.tensors.size());
      for (const auto& [name, t] : whole.tensors) {
        ASSERT_TRUE(torch::equal(part.at(name), t.slice(0, begin, end))) << name << " rows " << begin << ".." << end;
      }
      EXPECT_EQ(trainer.lossCount(part) + trainer.lossCount(whole.slice(0, begin)) +
                    trainer.lossCount(whole.slice(end, global)),
                trainer.lossCount(whole));
    }
  }
}

// A trainer set up with a recipe of configs/ and `overrides`.
template <typename T>
std::unique_ptr<T> setUp(const std::string& config, const std::vector<std::string>& overrides) {
  auto trainer = std::make_unique<T>(PluginContext{});
  Schema schema;
  describeCoreKeys(schema);
  trainer->describeKeys(schema);
  Recipe recipe = Recipe::load(test::sourceDir() + "/configs/" + config, overrides);
  recipe.validate(schema);
  trainer->setup(recipe);
  return trainer;
}

TEST(DataAtTheShare, EveryTrainerMakesARanksRowsAlone) {
  {
    llm::LlmTrainer trainer{PluginContext{}};
    Recipe recipe = llm_fixture::llmRecipe(trainer, {});
    trainer.setup(recipe);
    expectRowsOfTheGlobalBatch(trainer, 8);
  }
  expectRowsOfTheGlobalBatch(*setUp<detection::DetectionTrainer>("detection/mosaic_dp2.yaml", {"data.eval_size=8"}), 8);
  expectRowsOfTheGlobalBatch(
      *setUp<recommender::RecommenderTrainer>("recommender/recsys_small.yaml", {"data.eval_size=256"}), 16);
}

// ModelTrainer<Model> (engine/model_trainer.h): a trainer gets its own models
// back typed, by identity, and refuses a model it did not build.
TEST(ModelTrainer, HandsBackItsOwnModelsTypedAndRefusesOthers) {
  auto trainer = setUp<detection::DetectionTrainer>("detection/mosaic_dp2.yaml", {"data.eval_size=8"});
  auto other = setUp<detection::DetectionTrainer>("detection/mosaic_dp2.yaml", {"data.eval_size=8"});
  std::shared_ptr<StagedModel> a = trainer->buildModel(ModelBuild::outline());
  std::shared_ptr<StagedModel> b = trainer->buildModel(ModelBuild::outline());
  detection::CenterNetModel& net = trainer->ownModel(*a);
  EXPECT_EQ(static_cast<StagedModel*>(&net), a.get());
  EXPECT_EQ(static_cast<StagedModel*>(&trainer->ownModel(*b)), b.get());
  EXPECT_THROW(other->ownModel(*a), InternalError);
  // One it built but no longer holds alive is forgotten, not kept.
  std::shared_ptr<StagedModel> c = other->buildModel(ModelBuild::outline());
  c.reset();
  std::shared_ptr<StagedModel> d = other->buildModel(ModelBuild::outline());
  EXPECT_EQ(static_cast<StagedModel*>(&other->ownModel(*d)), d.get());
}

}  // namespace
}  // namespace ptrain

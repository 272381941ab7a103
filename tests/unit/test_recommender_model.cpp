// The recommender's model (trainers/recommender/recsys_model.h): the DLRM
// interaction against dot products written out by hand, the packed hidden's
// shape through both blocks, the loss as a sum of BCE over the samples, the
// attention ignoring padded history slots, and stages built apart holding
// the whole model's values.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "ptrain/datasets/clicks.h"
#include "ptrain/engine/batch.h"
#include "recsys_fixture.h"
#include "recsys_model.h"

namespace {

using ptrain::Batch;
using ptrain::ModelBuild;
using namespace ptrain::recommender;
namespace datasets = ptrain::datasets;

using ptrain::recsys_fixture::tinyConfig;

Batch tinyBatch(const RecsysConfig& c, int64_t n) {
  datasets::ClicksOptions o;
  o.table_sizes = c.table_sizes;
  o.history_length = c.history_length;
  o.validation_size = 64;
  datasets::ClicksDataset data(o);
  return data.batch(datasets::ClicksSplit::kTrain, 0, n);
}

}  // namespace

TEST(RecommenderModel, PairwiseDotsAreTheUpperTriangleByHand) {
  // Two samples of three 2-d vectors.
  at::Tensor v = torch::tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f, -1.f, 0.f, 2.f, 1.f, 0.5f, -2.f}).reshape({2, 3, 2});
  at::Tensor dots = pairwiseDots(v);
  ASSERT_EQ(dots.sizes(), (std::vector<int64_t>{2, 3}));
  // (0,1), (0,2), (1,2)
  const std::vector<float> want{1 * 3 + 2 * 4, 1 * 5 + 2 * 6, 3 * 5 + 4 * 6, -1 * 2 + 0 * 1, -1 * 0.5f + 0 * -2,
                                2 * 0.5f + 1 * -2};
  for (int64_t i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(dots.reshape({6})[i].item<float>(), want[static_cast<size_t>(i)]);
}

TEST(RecommenderModel, PackingHoldsEveryPartOnce) {
  const RecsysConfig c = tinyConfig(2);
  const RecsysPacking p(c);
  const int64_t pairs = kInteractionVectors * (kInteractionVectors - 1) / 2;
  EXPECT_EQ(pairs, 406);
  EXPECT_EQ(p.interaction_size, c.dim + pairs);
  EXPECT_EQ(p.width, p.interaction_size + 3 * c.dim + c.history_length * c.dim + c.history_length + c.dim + c.hidden);
  EXPECT_EQ(p.experts + c.hidden, p.width);
}

TEST(RecommenderModel, EmbedInteractionMatchesTheTablesAndTheBottomMlpByHand) {
  torch::manual_seed(3);
  const RecsysConfig c = tinyConfig(2);
  RecsysModel model(c);
  const Batch batch = tinyBatch(c, 6);
  at::Tensor hidden = model.embed(batch);
  const RecsysPacking& p = model.packing();
  ASSERT_EQ(hidden.sizes(), (std::vector<int64_t>{6, p.width}));

  // The 29 vectors by hand: bottom MLP output, the 26 rows of the tables,
  // the mean of the valid history items' rows, the first-order vector.
  auto params = model.module().named_parameters();
  auto row = [&](int64_t table, int64_t id) {
    auto* tables = dynamic_cast<ptrain::nn::EmbeddingTablesImpl*>(
        model.module().named_modules()["embed.tables"].get());
    return tables->lookup(table, torch::tensor({id}, torch::kInt64)).reshape({c.dim});
  };
  at::Tensor dense = batch.at("dense");
  at::Tensor z = torch::relu(torch::nn::functional::linear(dense, params["embed.bottom.0.weight"],
                                                           params["embed.bottom.0.bias"]));
  z = torch::relu(torch::nn::functional::linear(z, params["embed.bottom.2.weight"], params["embed.bottom.2.bias"]));
  const at::Tensor sparse = batch.at("sparse"), history = batch.at("history");
  for (int64_t i = 0; i < 6; ++i) {
    std::vector<at::Tensor> vectors{z[i]};
    for (int64_t t = 0; t < kSparseFeatures; ++t) vectors.push_back(row(t, sparse[i][t].item<int64_t>()));
    at::Tensor sum = torch::zeros({c.dim});
    int64_t valid = 0;
    for (int64_t h = 0; h < c.history_length; ++h) {
      const int64_t id = history[i][h].item<int64_t>();
      if (id < 0) continue;
      sum += row(c.item_feature, id);
      ++valid;
    }
    vectors.push_back(sum / static_cast<double>(std::max<int64_t>(1, valid)));
    vectors.push_back(params["embed.first_order"].reshape({c.dim}));
    ASSERT_EQ(static_cast<int64_t>(vectors.size()), kInteractionVectors);
    EXPECT_TRUE(torch::allclose(hidden[i].narrow(0, 0, c.dim), z[i], 1e-5, 1e-6));
    int64_t k = c.dim;
    for (int64_t a = 0; a < kInteractionVectors; ++a) {
      for (int64_t b = a + 1; b < kInteractionVectors; ++b, ++k) {
        EXPECT_NEAR(hidden[i][k].item<float>(), (vectors[a] * vectors[b]).sum().item<float>(), 1e-5)
            << "sample " << i << " pair " << a << "," << b;
      }
    }
    EXPECT_TRUE(torch::allclose(hidden[i].narrow(0, p.target, c.dim), vectors[1 + c.item_feature]));
    EXPECT_TRUE(torch::allclose(hidden[i].narrow(0, p.category, c.dim), vectors[1 + c.category_feature]));
    EXPECT_TRUE(torch::allclose(hidden[i].narrow(0, p.interest, c.dim), vectors[1 + c.interest_feature]));
    EXPECT_TRUE(torch::equal(hidden[i].narrow(0, p.mask, c.history_length), batch.at("history_mask")[i]));
    EXPECT_EQ(hidden[i].narrow(0, p.attention, c.dim + c.hidden).abs().sum().item<float>(), 0.f);
  }
}

TEST(RecommenderModel, BlocksKeepTheShapeAndTheLossIsASumOfBce) {
  for (int64_t experts : {0, 1, 4}) {
    torch::manual_seed(5);
    const RecsysConfig c = tinyConfig(experts);
    RecsysModel model(c);
    EXPECT_EQ(model.numExperts(), experts);
    EXPECT_EQ(model.moeLayers().size(), experts > 0 ? 1u : 0u);
    const Batch batch = tinyBatch(c, 8);
    at::Tensor h = model.embed(batch);
    at::Tensor a = model.runBlock(0, h);
    EXPECT_EQ(a.sizes(), h.sizes());
    // Block 0 writes the attention slot only.
    const RecsysPacking& p = model.packing();
    EXPECT_TRUE(torch::equal(a.narrow(1, 0, p.attention), h.narrow(1, 0, p.attention)));
    at::Tensor m = model.runBlock(1, a);
    EXPECT_EQ(m.sizes(), h.sizes());
    EXPECT_TRUE(torch::equal(m.narrow(1, 0, p.experts), a.narrow(1, 0, p.experts)));

    ptrain::LossOutput loss = model.head(m, batch);
    EXPECT_EQ(loss.count, 8.0);
    at::Tensor z = model.logits(m);
    ASSERT_EQ(z.sizes(), (std::vector<int64_t>{8}));
    const at::Tensor y = batch.at("labels");
    double want = 0;
    for (int64_t i = 0; i < 8; ++i) {
      const double zi = z[i].item<double>(), yi = y[i].item<double>();
      want += std::log1p(std::exp(-std::abs(zi))) + std::max(zi, 0.0) - zi * yi;
    }
    EXPECT_NEAR(loss.loss_sum.item<double>(), want, 1e-4 * want) << "experts " << experts;
    loss.loss_sum.backward();
    for (auto& item : model.module().named_parameters()) {
      EXPECT_TRUE(item.value().grad().defined()) << item.key();
    }
  }
}

TEST(RecommenderModel, AttentionIgnoresPaddedHistorySlots) {
  torch::manual_seed(9);
  const RecsysConfig c = tinyConfig(2);
  RecsysModel model(c);
  Batch batch = tinyBatch(c, 4);
  at::Tensor h = model.embed(batch);
  const RecsysPacking& p = model.packing();
  // Garbage in the padded slots' embeddings changes nothing.
  at::Tensor noisy = h.clone();
  at::Tensor items = noisy.narrow(1, p.history, c.history_length * c.dim).view({4, c.history_length, c.dim});
  at::Tensor mask = noisy.narrow(1, p.mask, c.history_length);
  items.add_((1 - mask).unsqueeze(2) * 100.0);
  at::Tensor clean = model.runBlock(0, h).narrow(1, p.attention, c.dim);
  at::Tensor dirty = model.runBlock(0, noisy).narrow(1, p.attention, c.dim);
  EXPECT_TRUE(torch::allclose(clean, dirty, 1e-5, 1e-6));
  // No history at all: attends to nothing.
  at::Tensor empty = h.clone();
  empty.narrow(1, p.mask, c.history_length).zero_();
  EXPECT_EQ(model.runBlock(0, empty).narrow(1, p.attention, c.dim).abs().sum().item<float>(), 0.f);
}

TEST(RecommenderModel, StagesBuiltApartHoldTheWholeModelsValues) {
  const RecsysConfig c = tinyConfig(4);
  torch::manual_seed(17);
  RecsysModel whole(c);
  auto all = whole.module().named_parameters();
  ModelBuild first;
  first.blocks = std::vector<int>{};
  first.head = false;
  ModelBuild second;
  second.blocks = std::vector<int>{0, 1};
  second.embed = false;
  for (const ModelBuild& build : {first, second}) {
    torch::manual_seed(17);
    RecsysModel part(c, build);
    auto mine = part.module().named_parameters();
    ASSERT_GT(mine.size(), 0u);
    for (const auto& item : mine) {
      ASSERT_TRUE(all.contains(item.key())) << item.key();
      EXPECT_TRUE(torch::equal(item.value(), all[item.key()])) << item.key();
    }
  }
  EXPECT_EQ(ModelBuild::outline().embed, false);
  torch::manual_seed(17);
  RecsysModel outline(c, ModelBuild::outline());
  EXPECT_EQ(outline.module().named_parameters().size(), 0u);
  EXPECT_EQ(outline.blockCost(0), c.attentionParameters());
  EXPECT_EQ(outline.blockCost(1), c.expertBlockParameters());
}

TEST(RecommenderModel, ParameterCountsMatchTheBuiltModel) {
  for (int64_t experts : {0, 4}) {
    const RecsysConfig c = tinyConfig(experts);
    torch::manual_seed(1);
    RecsysModel model(c);
    int64_t bottom = 0, attn = 0, block1 = 0, top = 0;
    for (const auto& item : model.module().named_parameters()) {
      const std::string& k = item.key();
      const int64_t n = item.value().numel();
      if (k.rfind("embed.bottom.", 0) == 0 || k == "embed.first_order") bottom += n;
      if (k.rfind("blocks.0.", 0) == 0) attn += n;
      if (k.rfind("blocks.1.", 0) == 0) block1 += n;
      if (k.rfind("head.", 0) == 0) top += n;
    }
    EXPECT_EQ(bottom, c.bottomParameters());
    EXPECT_EQ(attn, c.attentionParameters());
    EXPECT_EQ(block1, c.expertBlockParameters()) << "experts " << experts;
    EXPECT_EQ(top, c.topParameters());
  }
}

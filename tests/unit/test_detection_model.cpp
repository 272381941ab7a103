// The CenterNet parts of the detection trainer (trainers/detection/
// centernet.h): targets made from mosaic boxes, decoded back from head
// outputs that reproduce them exactly, give the ground truth again (COCO AP 1);
// the loss counts objects; the model keeps its shape through the blocks.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "centernet.h"
#include "coco_eval.h"
#include "ptrain/datasets/mosaic.h"

namespace {

using ptrain::Batch;
using namespace ptrain::detection;
namespace datasets = ptrain::datasets;

constexpr int64_t kClasses = 10;

// The head outputs a perfect detector would produce for `batch`: heatmap
// logits whose sigmoid is the target heatmap (background far below any
// peak), sizes and offsets of every object at its centre cell.
at::Tensor perfectOutputs(const Batch& batch) {
  const at::Tensor heat = batch.at("heatmap");
  const int64_t n = heat.size(0), side = heat.size(2), cells = side * side;
  at::Tensor logits = torch::logit(heat.clamp(1e-9, 1 - 1e-6));
  at::Tensor regression = torch::zeros({n, 4, cells});
  const at::Tensor centers = batch.at("center_index"), mask = batch.at("object_mask");
  const at::Tensor sizes = batch.at("size_target"), offsets = batch.at("offset_target");
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < centers.size(1); ++j) {
      if (mask[i][j].item<float>() == 0) continue;
      const int64_t c = centers[i][j].item<int64_t>();
      regression[i][0][c] = sizes[i][j][0];
      regression[i][1][c] = sizes[i][j][1];
      regression[i][2][c] = offsets[i][j][0];
      regression[i][3][c] = offsets[i][j][1];
    }
  }
  return torch::cat({logits, regression.reshape({n, 4, side, side})}, 1);
}

}  // namespace

TEST(DetectionModel, DecodingPerfectOutputsGivesTheGroundTruth) {
  datasets::MosaicOptions options;  // 128 canvases, 1-6 items
  const int64_t n = 16;
  Batch batch = datasets::mosaicBatch(options, datasets::MosaicSplit::kValidation, 0, n);
  addCenterNetTargets(batch, kClasses, options.canvas);
  const at::Tensor decoded = decodeCenterNet(perfectOutputs(batch), kClasses, 100);
  ASSERT_EQ(decoded.sizes(), (std::vector<int64_t>{n, 100, 6}));

  std::vector<GroundTruth> truth;
  std::vector<Detection> found;
  for (int64_t i = 0; i < n; ++i) {
    for (const auto& b : datasets::mosaicSample(options, datasets::MosaicSplit::kValidation, i).boxes) {
      GroundTruth gt;
      gt.image_id = i;
      gt.category_id = datasets::mosaicCocoCategoryId(b.label);
      gt.bbox = Box{double(b.x), double(b.y), double(b.width), double(b.height)};
      gt.area = double(b.area);
      truth.push_back(gt);
    }
    auto d = decoded[i];
    for (int64_t j = 0; j < 100; ++j) {
      const double score = d[j][1].item<double>();
      if (score <= 0) continue;
      Detection det;
      det.image_id = i;
      det.category_id = datasets::mosaicCocoCategoryId(d[j][0].item<int64_t>());
      det.score = score;
      det.bbox = Box{d[j][2].item<double>(), d[j][3].item<double>(), d[j][4].item<double>(), d[j][5].item<double>()};
      found.push_back(det);
    }
  }
  ASSERT_GE(found.size(), truth.size());
  const CocoMetrics m = evaluateCoco(truth, found);
  EXPECT_NEAR(m.ap, 1.0, 1e-9);
  EXPECT_NEAR(m.ap50, 1.0, 1e-9);
  EXPECT_NEAR(m.ar100, 1.0, 1e-9);

  // The highest-scoring detection of each canvas is one of its objects,
  // exactly (peaks have score 1).
  const auto first = datasets::mosaicSample(options, datasets::MosaicSplit::kValidation, 0).boxes;
  EXPECT_NEAR(decoded[0][0][1].item<double>(), 1.0, 1e-5);
  bool matched = false;
  for (const auto& b : first) {
    if (std::abs(decoded[0][0][2].item<double>() - double(b.x)) < 1e-3 &&
        std::abs(decoded[0][0][3].item<double>() - double(b.y)) < 1e-3 &&
        std::abs(decoded[0][0][4].item<double>() - double(b.width)) < 1e-3 &&
        std::abs(decoded[0][0][5].item<double>() - double(b.height)) < 1e-3) {
      matched = true;
    }
  }
  EXPECT_TRUE(matched);
}

TEST(DetectionModel, TargetsMarkEveryObjectCentreWithAPeak) {
  datasets::MosaicOptions options;
  Batch batch = datasets::mosaicBatch(options, datasets::MosaicSplit::kTrain, 0, 8);
  addCenterNetTargets(batch, kClasses, options.canvas);
  EXPECT_EQ(batch.at("heatmap").sizes(), (std::vector<int64_t>{8, kClasses, 32, 32}));
  EXPECT_EQ(batch.at("object_mask").sum().item<int64_t>(), batch.at("box_counts").sum().item<int64_t>());
  // At least one exact peak per object (two objects of a class may share a cell).
  EXPECT_GE(batch.at("heatmap").eq(1).sum().item<int64_t>(), 1);
  EXPECT_LE(batch.at("heatmap").eq(1).sum().item<int64_t>(), batch.at("box_counts").sum().item<int64_t>());
  EXPECT_TRUE(batch.at("offset_target").ge(0).all().item<bool>());
  EXPECT_TRUE(batch.at("offset_target").lt(1).all().item<bool>());
}

TEST(DetectionModel, ForwardKeepsTheBlockShapeAndCountsObjects) {
  torch::manual_seed(3);
  CenterNetConfig config;
  config.num_blocks = 2;
  CenterNetModel model(config);
  datasets::MosaicOptions options;
  options.canvas = 64;
  options.max_items = 3;
  options.max_scale = 1.25;
  Batch batch = datasets::mosaicBatch(options, datasets::MosaicSplit::kTrain, 0, 4);
  addCenterNetTargets(batch, kClasses, options.canvas);
  at::Tensor hidden = model.embed(batch);
  EXPECT_EQ(hidden.sizes(), (std::vector<int64_t>{4, config.channels, 16, 16}));
  at::Tensor after = model.runBlock(1, model.runBlock(0, hidden));
  EXPECT_EQ(after.sizes(), hidden.sizes());
  ptrain::LossOutput loss = model.head(after, batch);
  EXPECT_EQ(loss.count, batch.at("box_counts").sum().item<double>());
  EXPECT_TRUE(std::isfinite(loss.loss_sum.item<double>()));
  loss.loss_sum.backward();
  EXPECT_TRUE(model.module().named_parameters()["head.out.weight"].grad().defined());
  // Heatmap biases start at CenterNet's prior (sigmoid(-2.19) ~ 0.1).
  EXPECT_NEAR(model.module().named_parameters()["head.out.bias"][0].item<double>(), -2.19, 1e-6);
}

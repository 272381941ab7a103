// The CenterNet parts of the detection trainer (trainers/detection/
// centernet.h): targets made from mosaic boxes, decoded back from head
// outputs that reproduce them exactly, give the ground truth again (COCO AP 1);
// the loss counts objects; the model keeps its shape through the blocks.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <zlib.h>

#include <cmath>
#include <string>
#include <vector>

#include "centernet.h"
#include "coco_eval.h"
#include "picture.h"
#include "ptrain/datasets/mosaic.h"
#include "support/test_support.h"

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

// 64-pixel canvases of at most 3 items up to 1.25x: a few cells a side.
datasets::MosaicOptions smallMosaic() {
  datasets::MosaicOptions options;
  options.canvas = 64;
  options.max_items = 3;
  options.max_scale = 1.25;
  return options;
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
  const datasets::MosaicOptions options = smallMosaic();
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

// class_loss_weight adds w x the cross-entropy of the class logits at each
// object's centre cell, computed here by hand from the head's outputs.
TEST(DetectionModel, ClassLossIsTheCrossEntropyAtObjectCentres) {
  CenterNetConfig plain;
  plain.num_blocks = 1;
  CenterNetConfig weighted = plain;
  weighted.class_weight = 0.5;
  torch::manual_seed(5);
  CenterNetModel a(plain);
  torch::manual_seed(5);
  CenterNetModel b(weighted);
  const datasets::MosaicOptions options = smallMosaic();
  Batch batch = datasets::mosaicBatch(options, datasets::MosaicSplit::kTrain, 2, 3);
  addCenterNetTargets(batch, kClasses, options.canvas);
  torch::NoGradGuard noGrad;
  at::Tensor hidden = a.runBlock(0, a.embed(batch));
  const double lossA = a.head(hidden, batch).loss_sum.item<double>();
  const double lossB = b.head(b.runBlock(0, b.embed(batch)), batch).loss_sum.item<double>();

  const at::Tensor out = a.headOutputs(hidden).to(torch::kFloat64);
  const int64_t side = out.size(3);
  const at::Tensor centers = batch.at("center_index"), labels = batch.at("labels");
  const at::Tensor counts = batch.at("box_counts");
  double crossEntropy = 0;
  for (int64_t i = 0; i < counts.size(0); ++i) {
    for (int64_t j = 0; j < counts[i].item<int64_t>(); ++j) {
      const int64_t cell = centers[i][j].item<int64_t>();
      double sumExp = 0;
      for (int64_t c = 0; c < kClasses; ++c) sumExp += std::exp(out[i][c][cell / side][cell % side].item<double>());
      const int64_t label = labels[i][j].item<int64_t>();
      crossEntropy += std::log(sumExp) - out[i][label][cell / side][cell % side].item<double>();
    }
  }
  ASSERT_GT(counts.sum().item<int64_t>(), 0);
  EXPECT_NEAR(lossB - lossA, 0.5 * crossEntropy, 1e-4 * std::abs(crossEntropy));
}

// The head's phase-split path is the 3x3 convolution of the nearest-upsampled
// map, values and gradients, against libtorch's own upsample and conv2d.
TEST(DetectionModel, PhaseSplitUpsampleConvEqualsUpsampleThenConv) {
  torch::manual_seed(9);
  const auto f64 = torch::TensorOptions(torch::kFloat64);
  at::Tensor x = torch::randn({2, 5, 6, 7}, f64).requires_grad_(true);
  at::Tensor weight = torch::randn({4, 5, 3, 3}, f64).requires_grad_(true);
  at::Tensor bias = torch::randn({4}, f64).requires_grad_(true);
  at::Tensor fast = upsampleTwiceThenConv3x3(x, weight, bias);
  at::Tensor reference =
      torch::conv2d(torch::upsample_nearest2d(x, {12, 14}), weight, bias, /*stride=*/1, /*padding=*/1);
  ASSERT_EQ(fast.sizes(), reference.sizes());
  EXPECT_LT((fast - reference).abs().max().item<double>(), 1e-12);
  at::Tensor upstream = torch::randn(reference.sizes(), f64);
  auto gradsFast = torch::autograd::grad({fast}, {x, weight, bias}, {upstream});
  auto gradsReference = torch::autograd::grad({reference}, {x, weight, bias}, {upstream});
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_LT((gradsFast[i] - gradsReference[i]).abs().max().item<double>(), 1e-10) << i;
  }
}

// At block stride 8 the blocks run at half the side with dilations, and the
// head still answers at stride 4.
TEST(DetectionModel, BlockStrideEightUpsamplesToTheOutputStride) {
  torch::manual_seed(3);
  CenterNetConfig config;
  config.num_blocks = 2;
  config.block_stride = 8;
  config.dilations = {1, 2};
  CenterNetModel model(config);
  const datasets::MosaicOptions options = smallMosaic();
  Batch batch = datasets::mosaicBatch(options, datasets::MosaicSplit::kTrain, 0, 2);
  addCenterNetTargets(batch, kClasses, options.canvas);
  at::Tensor hidden = model.embed(batch);
  EXPECT_EQ(hidden.sizes(), (std::vector<int64_t>{2, config.channels, 8, 8}));
  at::Tensor after = model.runBlock(1, model.runBlock(0, hidden));
  EXPECT_EQ(after.sizes(), hidden.sizes());
  EXPECT_EQ(model.headOutputs(after).sizes(), (std::vector<int64_t>{2, kClasses + 4, 16, 16}));
  ptrain::LossOutput loss = model.head(after, batch);
  EXPECT_TRUE(std::isfinite(loss.loss_sum.item<double>()));
  EXPECT_EQ(normGroups(64), 16);
  EXPECT_EQ(normGroups(6), 1);
  EXPECT_EQ(normGroups(12), 3);
}

namespace {

// The PNG's IHDR fields and its decompressed rows (filter byte + RGB).
struct DecodedPng {
  uint32_t width = 0, height = 0;
  int bitDepth = 0, colourType = 0;
  std::string rows;
};

uint32_t readUint32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) | (uint32_t(uint8_t(s[at + 2])) << 8) |
         uint32_t(uint8_t(s[at + 3]));
}

DecodedPng decodePng(const std::string& file) {
  DecodedPng out;
  EXPECT_EQ(file.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::string idat;
  for (size_t at = 8; at + 12 <= file.size();) {
    const uint32_t length = readUint32(file, at);
    const std::string type = file.substr(at + 4, 4), data = file.substr(at + 8, length);
    const std::string typed = type + data;
    EXPECT_EQ(readUint32(file, at + 8 + length),
              crc32(0L, reinterpret_cast<const Bytef*>(typed.data()), static_cast<uInt>(typed.size())))
        << type;
    if (type == "IHDR") {
      out.width = readUint32(data, 0);
      out.height = readUint32(data, 4);
      out.bitDepth = uint8_t(data[8]);
      out.colourType = uint8_t(data[9]);
    } else if (type == "IDAT") {
      idat += data;
    }
    at += 12 + length;
  }
  out.rows.resize(size_t(out.height) * (size_t(out.width) * 3 + 1));
  uLongf size = out.rows.size();
  EXPECT_EQ(uncompress(reinterpret_cast<Bytef*>(out.rows.data()), &size, reinterpret_cast<const Bytef*>(idat.data()),
                       static_cast<uLong>(idat.size())),
            Z_OK);
  EXPECT_EQ(size, out.rows.size());
  return out;
}

Rgb pixelAt(const DecodedPng& png, int64_t x, int64_t y) {
  const size_t at = size_t(y) * (size_t(png.width) * 3 + 1) + 1 + size_t(x) * 3;
  return Rgb{uint8_t(png.rows[at]), uint8_t(png.rows[at + 1]), uint8_t(png.rows[at + 2])};
}

bool same(Rgb a, Rgb b) { return a.r == b.r && a.g == b.g && a.b == b.b; }

}  // namespace

// predictions.png: a valid PNG (read back with zlib) of the canvases, true
// boxes green, a detection of the right class blue, of the wrong class red.
TEST(DetectionPicture, PngOfCanvasesWithTrueAndDetectedBoxes) {
  const datasets::MosaicOptions options = smallMosaic();
  const datasets::MosaicSample first = datasets::mosaicSample(options, datasets::MosaicSplit::kValidation, 0);
  const datasets::MosaicBox& b = first.boxes.at(0);
  GroundTruth truth;
  truth.image_id = 0;
  truth.category_id = datasets::mosaicCocoCategoryId(b.label);
  truth.bbox = Box{double(b.x), double(b.y), double(b.width), double(b.height)};
  Detection right{0, truth.category_id, truth.bbox, 0.9};
  Detection wrong{1, truth.category_id, Box{4, 4, 20, 20}, 0.9};
  Detection faint{1, truth.category_id, Box{30, 30, 20, 20}, 0.1};

  const RgbImage picture = predictionPicture(options, 2, 2, 2, {truth}, {right, wrong, faint}, 0.3);
  const int64_t margin = 4, cell = 64 * 2;
  EXPECT_EQ(picture.width, 2 * cell + 3 * margin);
  EXPECT_EQ(picture.height, cell + 2 * margin);

  ptrain::test::TempDir tmp;
  const std::string path = tmp.path() + "/p.png";
  writePng(path, picture);
  const DecodedPng png = decodePng(ptrain::test::readFile(path));
  EXPECT_EQ(png.width, uint32_t(picture.width));
  EXPECT_EQ(png.height, uint32_t(picture.height));
  EXPECT_EQ(png.bitDepth, 8);
  EXPECT_EQ(png.colourType, 2);
  // The right detection's 1-pixel outline over the true box's 2-pixel one:
  // blue at the corner, green one pixel in.
  const int64_t x0 = margin + b.x * 2, y0 = margin + b.y * 2;
  EXPECT_TRUE(same(pixelAt(png, x0, y0), kRightDetectionColour));
  EXPECT_TRUE(same(pixelAt(png, x0 + 1, y0 + 1), kTrueBoxColour));
  // Canvas 1 has no truth here: its detection is red, the faint one absent.
  const int64_t left1 = margin + cell + margin;
  EXPECT_TRUE(same(pixelAt(png, left1 + 8, margin + 8), kWrongDetectionColour));
  const Rgb belowThreshold = pixelAt(png, left1 + 60, margin + 60);
  EXPECT_EQ(belowThreshold.r, belowThreshold.g);  // grey canvas, no box
  EXPECT_EQ(belowThreshold.g, belowThreshold.b);
  // The canvas itself: its grey levels, doubled in size (canvas 1's pixel
  // (40, 40), away from the red outline).
  const datasets::MosaicSample second = datasets::mosaicSample(options, datasets::MosaicSplit::kValidation, 1);
  const auto level = uint8_t(std::lround(second.image[0][40][40].item<float>() * 255.0f));
  EXPECT_TRUE(same(pixelAt(png, left1 + 80, margin + 80), Rgb{level, level, level}));
  EXPECT_TRUE(same(pixelAt(png, left1 + 81, margin + 81), Rgb{level, level, level}));
}

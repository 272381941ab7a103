// The mosaic dataset (datasets/mosaic) against Fashion-MNIST read here, bounds
// derived from bilinear interpolation, libtorch's own interpolate, and the COCO
// evaluator of the detection trainer.
#include <gtest/gtest.h>

#include <torch/torch.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "coco_eval.h"
#include "ptrain/datasets/mosaic.h"
#include "support/test_support.h"

using ptrain::ConfigError;
using ptrain::datasets::FashionMnistImages;
using ptrain::datasets::kMosaicForegroundLevel;
using ptrain::datasets::MosaicBox;
using ptrain::datasets::MosaicOptions;
using ptrain::datasets::MosaicSample;
using ptrain::datasets::MosaicSplit;
using ptrain::test::TempDir;

namespace {

constexpr int64_t kSide = ptrain::datasets::kFashionMnistSide;

MosaicOptions seeded(uint64_t seed) {
  MosaicOptions o;
  o.seed = seed;
  return o;
}

bool sameBoxes(const std::vector<MosaicBox>& a, const std::vector<MosaicBox>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].x != b[i].x || a[i].y != b[i].y || a[i].width != b[i].width || a[i].height != b[i].height ||
        a[i].label != b[i].label || a[i].source_index != b[i].source_index || a[i].scale != b[i].scale) {
      return false;
    }
  }
  return true;
}

bool sameSample(const MosaicSample& a, const MosaicSample& b) {
  return torch::equal(a.image, b.image) && sameBoxes(a.boxes, b.boxes);
}

double iou(const MosaicBox& a, const MosaicBox& b) {
  const double iw = std::min(a.x + a.width, b.x + b.width) - std::max(a.x, b.x);
  const double ih = std::min(a.y + a.height, b.y + b.height) - std::max(a.y, b.y);
  if (iw <= 0 || ih <= 0) return 0;
  return iw * ih / (double(a.width * a.height) + double(b.width * b.height) - iw * ih);
}

// Where a 28x28 source image can put foreground into its scaled copy, along
// one axis (columns when `columns`, else rows):
//   [any_lo, any_hi]: the extent of pixels >= level (25). An output pixel is
//     above the level only if one of its (at most) four interpolated source
//     pixels is >= 25 (a convex combination of values <= 24 stays below 25).
//   [block_lo, block_hi]: the first and last start of a 3x3 block of pixels
//     > 25. Samples are at most 1/scale <= 4/3 < 2 source pixels apart in
//     both axes, so each such block holds a sample, whose value (a convex
//     combination of values >= 26) is above the level.
struct SourceExtent {
  int any_lo = kSide, any_hi = -1;
  int block_lo = kSide, block_hi = -1;
};

SourceExtent sourceExtent(const uint8_t* image, bool columns) {
  SourceExtent e;
  auto at = [&](int r, int c) { return int{image[r * kSide + c]}; };
  for (int r = 0; r < kSide; ++r) {
    for (int c = 0; c < kSide; ++c) {
      const int pos = columns ? c : r;
      if (at(r, c) >= kMosaicForegroundLevel) {
        e.any_lo = std::min(e.any_lo, pos);
        e.any_hi = std::max(e.any_hi, pos);
      }
      if (r + 2 >= kSide || c + 2 >= kSide) continue;
      bool solid = true;
      for (int dr = 0; dr < 3 && solid; ++dr) {
        for (int dc = 0; dc < 3 && solid; ++dc) solid = at(r + dr, c + dc) > kMosaicForegroundLevel;
      }
      if (solid) {
        e.block_lo = std::min(e.block_lo, pos);
        e.block_hi = std::max(e.block_hi, pos);
      }
    }
  }
  return e;
}

// Bounds on a box side of an item at `scale` from its source extent along
// that axis. Output pixel o samples source coordinate (o + 0.5) / scale - 0.5,
// clamped at 0 (which moves only o = 0, by at most 0.25 at scale <= 2):
//   upper: foreground samples lie in [any_lo - 1, any_hi + 1), so
//          side < scale * (any_hi - any_lo + 2.25) + 1;
//   lower: one sample in the first block, one in the last, so
//          side >= scale * (block_hi - block_lo - 2) + 1.
void expectSideWithinBounds(int64_t side, double scale, const SourceExtent& e, const std::string& what) {
  ASSERT_GE(e.any_hi, e.any_lo) << what;
  EXPECT_LT(side, scale * (e.any_hi - e.any_lo + 2.25) + 1 + 1e-9) << what;
  if (e.block_hi >= 0) {
    EXPECT_GE(side, scale * (e.block_hi - e.block_lo - 2) + 1 - 1e-9) << what;
  }
}

// Every property a canvas of `split` must have under `o`.
void expectValidCanvas(const MosaicOptions& o, MosaicSplit split, int64_t index) {
  const MosaicSample sample = ptrain::datasets::mosaicSample(o, split, index);
  const FashionMnistImages& source = ptrain::datasets::fashionMnist(split);
  const std::string where = std::string(ptrain::datasets::mosaicSplitName(split)) + " canvas " + std::to_string(index);
  ASSERT_EQ(sample.image.sizes(), (std::vector<int64_t>{1, o.canvas, o.canvas})) << where;
  ASSERT_EQ(sample.image.scalar_type(), torch::kFloat32) << where;
  EXPECT_GE(sample.image.min().item<float>(), 0.0f) << where;
  EXPECT_LE(sample.image.max().item<float>(), 1.0f) << where;
  // min_items is the fewest drawn; items that find no place are dropped, but
  // the first always fits.
  ASSERT_GE(sample.boxes.size(), 1u) << where;
  ASSERT_LE(static_cast<int64_t>(sample.boxes.size()), o.max_items) << where;
  const float* canvas = sample.image.data_ptr<float>();
  // The canvas rebuilt from its boxes: each placed item's levels rounded half
  // up to a byte, composited by max, 0 elsewhere.
  std::vector<float> rebuilt(static_cast<size_t>(o.canvas * o.canvas), 0.0f);

  for (size_t k = 0; k < sample.boxes.size(); ++k) {
    const MosaicBox& b = sample.boxes[k];
    const std::string what = where + " box " + std::to_string(k);
    EXPECT_GE(b.x, 0) << what;
    EXPECT_GE(b.y, 0) << what;
    EXPECT_GE(b.width, 1) << what;
    EXPECT_GE(b.height, 1) << what;
    EXPECT_LE(b.x + b.width, o.canvas) << what;
    EXPECT_LE(b.y + b.height, o.canvas) << what;
    EXPECT_EQ(b.area, b.width * b.height) << what;

    // The item comes from this split, with that split's label.
    ASSERT_GE(b.source_index, 0) << what;
    ASSERT_LT(b.source_index, source.count) << what;
    EXPECT_EQ(b.label, int64_t{source.labels[static_cast<size_t>(b.source_index)]}) << what;

    // Scale: the drawn range, on the grid of whole pixel sizes.
    const int64_t size = std::lround(b.scale * kSide);
    EXPECT_NEAR(b.scale * kSide, static_cast<double>(size), 1e-9) << what;
    EXPECT_GE(b.scale, o.min_scale) << what;
    EXPECT_LE(b.scale, o.max_scale) << what;
    EXPECT_LE(b.width, size) << what;
    EXPECT_LE(b.height, size) << what;
    const uint8_t* image = source.image(b.source_index);
    expectSideWithinBounds(b.width, b.scale, sourceExtent(image, true), what + " width");
    expectSideWithinBounds(b.height, b.scale, sourceExtent(image, false), what + " height");

    // The scaled source item, placed so that its tight box is this box, lies
    // under the canvas everywhere (max compositing), and the box holds a pixel
    // above the foreground level.
    const std::vector<float> item = ptrain::datasets::mosaicScaleItem(image, size);
    int64_t x0 = size, y0 = size, x1 = 0, y1 = 0;
    for (int64_t y = 0; y < size; ++y) {
      for (int64_t x = 0; x < size; ++x) {
        if (item[y * size + x] > kMosaicForegroundLevel) {
          x0 = std::min(x0, x), y0 = std::min(y0, y), x1 = std::max(x1, x + 1), y1 = std::max(y1, y + 1);
        }
      }
    }
    ASSERT_EQ(x1 - x0, b.width) << what;
    ASSERT_EQ(y1 - y0, b.height) << what;
    const int64_t left = b.x - x0, top = b.y - y0;
    ASSERT_GE(left, 0) << what;
    ASSERT_GE(top, 0) << what;
    ASSERT_LE(left + size, o.canvas) << what;
    ASSERT_LE(top + size, o.canvas) << what;
    // A canvas holds bytes (levels / 255): the item's level rounded half up
    // (an interpolated level of 25.5 is stored as 26, 25.49 as 25).
    int64_t below = 0, offGrid = 0;
    for (int64_t y = 0; y < size; ++y) {
      for (int64_t x = 0; x < size; ++x) {
        const float stored = canvas[(top + y) * o.canvas + left + x];
        const double level = std::min(255.0, std::floor(double(item[y * size + x]) + 0.5));
        below += stored < static_cast<float>(level) / 255.0f;
        offGrid += static_cast<float>(std::lround(stored * 255.0f)) / 255.0f != stored;
      }
    }
    EXPECT_EQ(below, 0) << what << ": canvas pixels darker than the item's stored levels";
    for (int64_t y = 0; y < size; ++y) {
      for (int64_t x = 0; x < size; ++x) {
        float& r = rebuilt[static_cast<size_t>((top + y) * o.canvas + left + x)];
        r = std::max(r, static_cast<float>(std::min(255.0, std::floor(double(item[y * size + x]) + 0.5))) / 255.0f);
      }
    }
    EXPECT_EQ(offGrid, 0) << what << ": canvas pixels that are not a byte / 255";
    float brightest = 0;
    for (int64_t y = b.y; y < b.y + b.height; ++y) {
      for (int64_t x = b.x; x < b.x + b.width; ++x) brightest = std::max(brightest, canvas[y * o.canvas + x]);
    }
    EXPECT_GT(brightest * 255.0f, kMosaicForegroundLevel - 1e-3f) << what;

    for (size_t j = 0; j < k; ++j) {
      EXPECT_LE(iou(b, sample.boxes[j]), o.max_iou + 1e-12) << what << " against box " << j;
    }
  }
  int64_t differ = 0;
  for (size_t p = 0; p < rebuilt.size(); ++p) differ += rebuilt[p] != canvas[p];
  EXPECT_EQ(differ, 0) << where << ": pixels that are not the max of the items' rounded levels";
}

}  // namespace

TEST(MosaicDataset, LoadsEachFashionMnistSplitOnce) {
  const FashionMnistImages& train = ptrain::datasets::fashionMnist(MosaicSplit::kTrain);
  const FashionMnistImages& test = ptrain::datasets::fashionMnist(MosaicSplit::kValidation);
  EXPECT_EQ(train.count, 60000);
  EXPECT_EQ(test.count, 10000);
  EXPECT_EQ(train.pixels.size(), size_t{60000} * 28 * 28);
  EXPECT_EQ(test.labels.size(), size_t{10000});
  // The cache hands back the same images.
  EXPECT_EQ(&ptrain::datasets::fashionMnist(MosaicSplit::kTrain), &train);
  EXPECT_EQ(&ptrain::datasets::fashionMnist(MosaicSplit::kValidation), &test);
  // Each class is present in both splits (6000 and 1000 each).
  std::vector<int64_t> perClass(10, 0);
  for (uint8_t label : test.labels) ++perClass[label];
  for (int64_t n : perClass) EXPECT_EQ(n, 1000);
}

TEST(MosaicDataset, MissingFilesNameTheFileAndThePackage) {
  TempDir empty;
  try {
    ptrain::datasets::loadFashionMnist(empty.path(), MosaicSplit::kValidation);
    FAIL() << "an empty folder loaded";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(empty.path() + "/t10k-images-idx3-ubyte.gz"), std::string::npos) << message;
    EXPECT_NE(message.find("apt-get install dataset-fashion-mnist"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(MosaicDataset, TruncatedFileIsAConfigError) {
  TempDir folder;
  // A gzip stream whose IDX header announces 10000 images but holds none.
  const std::string path = folder.path() + "/train-images-idx3-ubyte.gz";
  const unsigned char header[16] = {0, 0, 8, 3, 0, 0, 0x27, 0x10, 0, 0, 0, 28, 0, 0, 0, 28};
  gzFile out = gzopen(path.c_str(), "wb");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(gzwrite(out, header, sizeof header), 16);
  ASSERT_EQ(gzclose(out), Z_OK);
  try {
    ptrain::datasets::loadFashionMnist(folder.path(), MosaicSplit::kTrain);
    FAIL() << "a truncated file loaded";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

TEST(MosaicDataset, SameIndexGivesTheSameCanvas) {
  using ptrain::datasets::mosaicSample;
  for (MosaicSplit split : {MosaicSplit::kTrain, MosaicSplit::kValidation}) {
    const MosaicSample a = mosaicSample(seeded(11), split, 5);
    const MosaicSample b = mosaicSample(seeded(11), split, 5);
    EXPECT_TRUE(sameSample(a, b));
    EXPECT_FALSE(sameSample(a, mosaicSample(seeded(11), split, 6)));
  }
  // The training seed selects the training canvases.
  EXPECT_FALSE(sameSample(mosaicSample(seeded(11), MosaicSplit::kTrain, 5),
                          mosaicSample(seeded(12), MosaicSplit::kTrain, 5)));
  // Training and validation canvas i are unrelated.
  EXPECT_FALSE(sameSample(mosaicSample(seeded(11), MosaicSplit::kTrain, 5),
                          mosaicSample(seeded(11), MosaicSplit::kValidation, 5)));
}

TEST(MosaicDataset, ValidationIgnoresTheTrainingSeed) {
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(sameSample(ptrain::datasets::mosaicSample(seeded(1), MosaicSplit::kValidation, i),
                           ptrain::datasets::mosaicSample(seeded(987654321), MosaicSplit::kValidation, i)))
        << "validation canvas " << i;
  }
}

TEST(MosaicDataset, CanvasesKeepTheirBoxesScalesAndSplits) {
  const MosaicOptions o = seeded(3);
  for (int64_t i = 0; i < 150; ++i) {
    expectValidCanvas(o, MosaicSplit::kTrain, i);
    expectValidCanvas(o, MosaicSplit::kValidation, i);
    if (HasFatalFailure() || HasFailure()) return;
  }
}

TEST(MosaicDataset, DrawsSpreadOverTheirRanges) {
  const MosaicOptions o = seeded(4);
  std::set<size_t> counts;
  std::set<int64_t> labels;
  double smallest = 10, largest = 0;
  int64_t trainBeyondTest = 0;
  int64_t highestValidation = 0;
  for (int64_t i = 0; i < 200; ++i) {
    const MosaicSample train = ptrain::datasets::mosaicSample(o, MosaicSplit::kTrain, i);
    counts.insert(train.boxes.size());
    for (const MosaicBox& b : train.boxes) {
      labels.insert(b.label);
      smallest = std::min(smallest, b.scale);
      largest = std::max(largest, b.scale);
      trainBeyondTest += b.source_index >= 10000;
    }
    for (const MosaicBox& b : ptrain::datasets::mosaicSample(o, MosaicSplit::kValidation, i).boxes) {
      highestValidation = std::max(highestValidation, b.source_index);
    }
  }
  EXPECT_GE(counts.size(), 5u) << "item counts 1..6 should nearly all occur in 200 canvases";
  EXPECT_EQ(*counts.begin(), 1u);
  EXPECT_EQ(labels.size(), 10u);
  EXPECT_LT(smallest, 0.85);
  EXPECT_GT(largest, 1.9);
  // Training items come from all 60000 training images (5/6 of them beyond
  // the test split's 10000); validation items only from the 10000.
  EXPECT_GT(trainBeyondTest, 300);
  EXPECT_LT(highestValidation, 10000);
  EXPECT_GT(highestValidation, 9000);
}

TEST(MosaicDataset, OtherOptionsShapeTheCanvas) {
  MosaicOptions o = seeded(5);
  o.canvas = 64;
  o.min_items = 2;
  o.max_items = 3;
  o.min_scale = 1.0;
  o.max_scale = 1.5;
  o.max_iou = 0.0;
  for (int64_t i = 0; i < 40; ++i) {
    expectValidCanvas(o, MosaicSplit::kTrain, i);
    if (HasFailure()) return;
  }
}

TEST(MosaicDataset, ScaleItemMatchesLibtorchBilinear) {
  const uint8_t* image = ptrain::datasets::fashionMnist(MosaicSplit::kValidation).image(42);
  const at::Tensor source =
      torch::from_blob(const_cast<uint8_t*>(image), {1, 1, kSide, kSide}, torch::kUInt8).to(torch::kFloat32);
  for (int64_t size : {21, 27, 28, 37, 50, 56}) {
    namespace F = torch::nn::functional;
    const at::Tensor expected = F::interpolate(source, F::InterpolateFuncOptions()
                                                            .size(std::vector<int64_t>{size, size})
                                                            .mode(torch::kBilinear)
                                                            .align_corners(false))
                                    .reshape({size * size});
    std::vector<float> ours = ptrain::datasets::mosaicScaleItem(image, size);
    const at::Tensor got = torch::from_blob(ours.data(), {size * size}, torch::kFloat32);
    EXPECT_LT((got - expected).abs().max().item<float>(), 1e-3f) << "size " << size;
  }
}

// A canvas is bytes: the sample's image is exactly those levels / 255, and
// an item's stored level is its interpolated level rounded half up
// (computed here from the bilinear formula, not the generator's rounding).
TEST(MosaicDataset, CanvasIsBytesRoundedHalfUp) {
  const MosaicOptions o = seeded(8);
  for (int64_t i = 0; i < 20; ++i) {
    const ptrain::datasets::MosaicCanvas c = ptrain::datasets::mosaicCanvas(o, MosaicSplit::kTrain, i);
    const MosaicSample s = ptrain::datasets::mosaicSample(o, MosaicSplit::kTrain, i);
    ASSERT_EQ(c.side, o.canvas);
    ASSERT_TRUE(sameBoxes(c.boxes, s.boxes));
    at::Tensor bytes = torch::from_blob(const_cast<uint8_t*>(c.pixels.data()), {1, o.canvas, o.canvas}, torch::kUInt8);
    EXPECT_TRUE(torch::equal(bytes.to(torch::kFloat32).div(255.0f), s.image)) << i;
  }
}

TEST(MosaicDataset, BatchStacksTheSamples) {
  const MosaicOptions o = seeded(6);
  const ptrain::Batch batch = ptrain::datasets::mosaicBatch(o, MosaicSplit::kTrain, 10, 4);
  ASSERT_EQ(batch.at("images").sizes(), (std::vector<int64_t>{4, 1, 128, 128}));
  ASSERT_EQ(batch.at("boxes").sizes(), (std::vector<int64_t>{4, 6, 4}));
  ASSERT_EQ(batch.at("labels").sizes(), (std::vector<int64_t>{4, 6}));
  ASSERT_EQ(batch.at("box_counts").sizes(), (std::vector<int64_t>{4}));
  for (int64_t r = 0; r < 4; ++r) {
    const MosaicSample s = ptrain::datasets::mosaicSample(o, MosaicSplit::kTrain, 10 + r);
    EXPECT_TRUE(torch::equal(batch.at("images")[r], s.image)) << r;
    const int64_t n = static_cast<int64_t>(s.boxes.size());
    EXPECT_EQ(batch.at("box_counts")[r].item<int64_t>(), n);
    for (int64_t k = 0; k < 6; ++k) {
      const at::Tensor box = batch.at("boxes")[r][k];
      if (k < n) {
        const MosaicBox& b = s.boxes[static_cast<size_t>(k)];
        EXPECT_TRUE(torch::equal(box, torch::tensor({float(b.x), float(b.y), float(b.width), float(b.height)})));
        EXPECT_EQ(batch.at("labels")[r][k].item<int64_t>(), b.label);
      } else {
        EXPECT_EQ(box.abs().sum().item<float>(), 0.0f);
        EXPECT_EQ(batch.at("labels")[r][k].item<int64_t>(), -1);
      }
    }
  }
}

TEST(MosaicDataset, RejectsOptionsThatCannotWork) {
  auto rejected = [](MosaicOptions o, const std::string& key) {
    const auto problem = ptrain::datasets::checkMosaicOptions(o);
    ASSERT_TRUE(problem.has_value()) << key;
    EXPECT_NE(problem->find(key), std::string::npos) << *problem;
    EXPECT_THROW(ptrain::datasets::mosaicSample(o, MosaicSplit::kTrain, 0), ConfigError) << key;
  };
  EXPECT_FALSE(ptrain::datasets::checkMosaicOptions(MosaicOptions{}).has_value());
  MosaicOptions o;
  o.canvas = 50;  // an item at scale 2 is 56 pixels wide
  rejected(o, "canvas=50");
  o = MosaicOptions{};
  o.min_items = 0;
  rejected(o, "min_items=0");
  o = MosaicOptions{};
  o.max_items = 0;
  rejected(o, "max_items=0");
  o = MosaicOptions{};
  o.min_scale = 3;
  rejected(o, "scale range");
  o = MosaicOptions{};
  o.max_iou = 1.5;
  rejected(o, "max_iou=1.5");
}

TEST(MosaicCoco, ExportHoldsTheValidationCanvases) {
  TempDir folder;
  const std::string path = folder.path() + "/mosaic_val.json";
  const MosaicOptions o = seeded(7);
  ptrain::datasets::writeCocoGroundTruth(path, o, 25);
  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in);

  ASSERT_EQ(doc.at("images").size(), 25u);
  ASSERT_EQ(doc.at("categories").size(), 10u);
  for (int64_t c = 0; c < 10; ++c) {
    EXPECT_EQ(doc["categories"][c].at("id").get<int64_t>(), c + 1);
    EXPECT_EQ(doc["categories"][c].at("name").get<std::string>(), ptrain::datasets::kFashionMnistClassNames[c]);
  }
  EXPECT_EQ(doc["categories"][9]["name"], "Ankle boot");
  size_t annotation = 0;
  for (int64_t i = 0; i < 25; ++i) {
    const nlohmann::json& image = doc["images"][i];
    EXPECT_EQ(image.at("id").get<int64_t>(), i);
    EXPECT_EQ(image.at("width").get<int64_t>(), 128);
    EXPECT_EQ(image.at("height").get<int64_t>(), 128);
    EXPECT_TRUE(image.at("file_name").is_string());
    // The seed does not matter to validation canvases.
    const MosaicSample s = ptrain::datasets::mosaicSample(seeded(99), MosaicSplit::kValidation, i);
    for (const MosaicBox& b : s.boxes) {
      ASSERT_LT(annotation, doc.at("annotations").size());
      const nlohmann::json& a = doc["annotations"][annotation++];
      EXPECT_EQ(a.at("id").get<size_t>(), annotation);
      EXPECT_EQ(a.at("image_id").get<int64_t>(), i);
      EXPECT_EQ(a.at("category_id").get<int64_t>(), b.label + 1);
      EXPECT_EQ(a.at("bbox"), nlohmann::json({b.x, b.y, b.width, b.height}));
      EXPECT_EQ(a.at("area").get<int64_t>(), b.area);
      EXPECT_EQ(a.at("iscrowd").get<int64_t>(), 0);
    }
  }
  EXPECT_EQ(annotation, doc.at("annotations").size());
}

TEST(MosaicCoco, GroundTruthAsDetectionsScoresApOne) {
  TempDir folder;
  const std::string path = folder.path() + "/mosaic_val.json";
  ptrain::datasets::writeCocoGroundTruth(path, seeded(0), 40);
  const std::vector<ptrain::detection::GroundTruth> truth = ptrain::detection::readCocoGroundTruth(path);
  ASSERT_GE(truth.size(), 40u);
  std::vector<ptrain::detection::Detection> detections;
  for (const auto& g : truth) detections.push_back({g.image_id, g.category_id, g.bbox, 1.0});
  const ptrain::detection::CocoMetrics m = ptrain::detection::evaluateCoco(truth, detections);
  EXPECT_DOUBLE_EQ(m.ap, 1.0);
  EXPECT_DOUBLE_EQ(m.ap50, 1.0);
  EXPECT_DOUBLE_EQ(m.ar100, 1.0);
  // One box off by a whole item lowers it: the export is what is scored.
  detections.front().bbox.x += 60;
  EXPECT_LT(ptrain::detection::evaluateCoco(truth, detections).ap, 1.0);
}

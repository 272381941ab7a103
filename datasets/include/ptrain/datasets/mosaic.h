// Mosaics of Fashion-MNIST items for object detection: a grey canvas holding
// a few clothing items of random size at random places, each with its box and
// class.
//
// Source: Debian's dataset-fashion-mnist package (the four gzip-compressed IDX
// files under /usr/share/datasets/fashion-mnist), 28x28 uint8 images with
// labels 0-9. Each file is read once per process (fashionMnist()). Training
// canvases draw items only from the package's training split (60000 images),
// validation canvases only from its test split (10000), so no item image seen
// in training appears in validation.
//
// A canvas (mosaicSample):
//   - pixels: 8-bit levels (mosaicCanvas), given to the model as float32
//     [1, canvas, canvas] in [0, 1] (level / 255, a division, so 255 is 1);
//     background 0, as in Fashion-MNIST itself (light item on black).
//   - n items, n uniform in [min_items, max_items]. Item k is a source image
//     scaled to S x S pixels, S = round(28 * u), u uniform in [min_scale,
//     max_scale], by bilinear interpolation with half-pixel centres (libtorch's
//     interpolate with align_corners=false, edges clamped; no antialiasing).
//     Its effective scale is S / 28.
//   - its box: the tight box of the scaled item's pixels above
//     kMosaicForegroundLevel / 255 (about 0.1), not the whole S x S square, so
//     the box hugs the garment.
//   - placement: the S x S square at a uniform position fully inside the
//     canvas, retried up to kMosaicPlacementTries times until the item's box
//     has IoU <= max_iou with every box already placed; an item that never
//     fits is dropped. The first item always fits (the canvas is at least
//     S wide), so every canvas holds at least one box.
//   - compositing: per-pixel max of the items' levels, each rounded half up
//     to a byte (floor(v + 0.5), clamped to 255) as a stored image would
//     hold it; so an item never darkens another, every box keeps its own
//     foreground pixels, and a canvas written as an 8-bit PNG reads back
//     exactly (ptrain data export mosaic). The boxes are found on the
//     unrounded levels (above kMosaicForegroundLevel).
//
// Boxes are COCO's xywh in whole pixels: the box covers columns [x, x + width)
// and rows [y, y + height); area = width * height. Class ids are
// Fashion-MNIST's labels 0-9 everywhere in memory; only the COCO JSON uses
// 1-10 (mosaicCocoCategoryId), COCO's convention of 1-based category ids.
//
// Determinism: canvas `index` of a split comes from a splitmix64 stream seeded
// by hash(seed, split, index), so it is a pure function of (options, split,
// index): the same on every rank, every call and every platform (no std::
// distributions, no torch generator). Training canvases use options.seed;
// validation canvases use the fixed kMosaicValidationSeed and ignore
// options.seed, so the validation set is the same for every training run with
// the same canvas options.
//
// Thread-safety: every function may be called from several threads at once.
//
// Linked statically into the trainers that use it (ptrain_datasets).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"
#include "ptrain/engine/batch.h"

namespace ptrain::datasets {

enum class MosaicSplit { kTrain, kValidation };

// "train" / "validation".
const char* mosaicSplitName(MosaicSplit split);

// Fashion-MNIST's class names, index = label.
inline constexpr const char* kFashionMnistClassNames[10] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
inline constexpr int64_t kFashionMnistClasses = 10;
inline constexpr int64_t kFashionMnistSide = 28;
// Where Debian's dataset-fashion-mnist puts the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// A scaled item's pixel counts as foreground (inside its box) above this
// level on the 0-255 scale; 25 keeps the faint halo of anti-aliased edges out.
inline constexpr int kMosaicForegroundLevel = 25;
// Random positions tried per item before it is dropped.
inline constexpr int kMosaicPlacementTries = 100;
// The seed of every validation canvas, whatever options.seed is.
inline constexpr uint64_t kMosaicValidationSeed = 0x6D6F73616963ULL;

// One split of Fashion-MNIST: `count` images of 28x28 bytes, row-major, one
// after another, and their labels 0-9.
struct FashionMnistImages {
  int64_t count = 0;
  std::vector<uint8_t> pixels;  // count * 28 * 28
  std::vector<uint8_t> labels;  // count

  const uint8_t* image(int64_t i) const { return pixels.data() + i * kFashionMnistSide * kFashionMnistSide; }
};

// Reads one split from `directory` (train-* for kTrain, t10k-* for
// kValidation). Throws ConfigError naming the file: missing (with the package
// to install), unreadable, truncated, or not an IDX file of 28x28 images with
// labels 0-9 and as many labels as images.
FashionMnistImages loadFashionMnist(const std::string& directory, MosaicSplit split);

// The split from kFashionMnistDir, read on first use and kept for the life of
// the process. A failed read throws (as loadFashionMnist) and is retried on the
// next call.
const FashionMnistImages& fashionMnist(MosaicSplit split);

struct MosaicOptions {
  int64_t canvas = 128;     // canvas side in pixels; >= round(28 * max_scale)
  int64_t min_items = 1;    // items drawn per canvas, uniform in [min_items, max_items]; a canvas may
                            // hold fewer (items that find no place are dropped), never fewer than 1
  int64_t max_items = 6;
  double min_scale = 0.75;  // item scale, uniform in [min_scale, max_scale] (28 px = scale 1)
  double max_scale = 2.0;
  double max_iou = 0.3;     // the most two boxes of one canvas may overlap, in [0, 1]
  uint64_t seed = 0;        // training canvases only; validation uses kMosaicValidationSeed
};

// What is wrong with `options` ("max_items=0 is below min_items=1; ..."), or nullopt.
std::optional<std::string> checkMosaicOptions(const MosaicOptions& options);

struct MosaicBox {
  int64_t x = 0, y = 0, width = 0, height = 0;  // pixels, COCO's xywh
  int64_t label = 0;                             // Fashion-MNIST class, 0-9
  int64_t area = 0;                              // width * height
  int64_t source_index = 0;                      // the item's image in its Fashion-MNIST split
  double scale = 1;                              // S / 28, the effective scale of the item
};

// A canvas as stored: side * side bytes, row-major (the 0-255 levels).
struct MosaicCanvas {
  int64_t side = 0;
  std::vector<uint8_t> pixels;
  std::vector<MosaicBox> boxes;   // 1..max_items, in the order the items were placed
};

// Canvas `index` (>= 0) of `split` as bytes; mosaicSample's image is these
// levels / 255. Throws as mosaicSample.
MosaicCanvas mosaicCanvas(const MosaicOptions& options, MosaicSplit split, int64_t index);

struct MosaicSample {
  at::Tensor image;               // [1, canvas, canvas] float32: the canvas's bytes / 255
  std::vector<MosaicBox> boxes;   // 1..max_items, in the order the items were placed
};

// Canvas `index` (>= 0) of `split`. Throws ConfigError for bad options
// (checkMosaicOptions) or a missing data set (fashionMnist).
MosaicSample mosaicSample(const MosaicOptions& options, MosaicSplit split, int64_t index);

// Canvases first..first+count-1 of `split`, stacked:
//   "images"     [count, 1, canvas, canvas] float32
//   "boxes"      [count, max_items, 4] float32 xywh, zero rows past box_counts
//   "labels"     [count, max_items] int64 0-9, -1 past box_counts
//   "box_counts" [count] int64
Batch mosaicBatch(const MosaicOptions& options, MosaicSplit split, int64_t first, int64_t count);

// The detection trainer's batch layout (mosaicBatch's tensors), filled row by
// row by every source of canvases (the generator, COCO files), so that equal
// bytes and boxes give equal batches: pixels as byte / 255 (divided, so 255
// is exactly 1), up to `slots` boxes a row (xywh as float, labels, -1 past
// the row's count). One thread.
class DetectionBatchWriter {
 public:
  DetectionBatchWriter(int64_t count, int64_t side, int64_t slots);
  // Row r: side * side bytes, and its boxes (anything with x, y, width,
  // height and label: MosaicBox, CocoDataset's CanvasBox); boxes past
  // `slots` are left out.
  template <typename Box>
  void setRow(int64_t r, const std::vector<uint8_t>& pixels, const std::vector<Box>& rowBoxes) {
    setPixels(r, pixels);
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(rowBoxes.size()), slots_);
    for (int64_t k = 0; k < n; ++k) {
      const Box& b = rowBoxes[static_cast<size_t>(k)];
      setBox(r, k, b.x, b.y, b.width, b.height, b.label);
    }
    setCount(r, n);
  }
  // "images", "boxes", "labels", "box_counts".
  Batch finish();

 private:
  void setPixels(int64_t r, const std::vector<uint8_t>& pixels);
  void setBox(int64_t r, int64_t k, int64_t x, int64_t y, int64_t width, int64_t height, int64_t label);
  void setCount(int64_t r, int64_t n);
  int64_t side_, slots_;
  at::Tensor images_, boxes_, labels_, counts_;
};

// A 28x28 image scaled to size x size as the canvases scale their items
// (bilinear, half-pixel centres, edges clamped), row-major, on the 0-255 scale.
std::vector<float> mosaicScaleItem(const uint8_t* image, int64_t size);

// The COCO category id of a label: label + 1.
inline int64_t mosaicCocoCategoryId(int64_t label) { return label + 1; }

// Writes validation canvases 0..count-1 as a COCO instances file: "images"
// (id = the canvas index, width, height, file_name "mosaic_val_<index>.png";
// no image files are written), "annotations" (ids 1..N in canvas order, bbox
// [x, y, w, h], area, iscrowd 0, category_id = mosaicCocoCategoryId(label)) and
// "categories" (ids 1-10 with Fashion-MNIST's names). Detections of a
// validation canvas are compared with it by image_id = canvas index. Throws
// ConfigError as mosaicSample, or when `path` cannot be written.
void writeCocoGroundTruth(const std::string& path, const MosaicOptions& options, int64_t count);

}  // namespace ptrain::datasets

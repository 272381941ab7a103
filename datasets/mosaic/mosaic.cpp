#include "ptrain/datasets/mosaic.h"

#include "ptrain/datasets/splitmix.h"

#include <torch/torch.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <mutex>
#include <sstream>

namespace ptrain::datasets {
namespace {

constexpr int64_t kPixels = kFashionMnistSide * kFashionMnistSide;
constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
// Source images drawn for one item before giving it up: a draw is only
// rejected when the scaled image has no pixel above the foreground level,
// which no Fashion-MNIST image is known to do.
constexpr int kSourceTries = 16;

uint64_t sampleSeed(const MosaicOptions& options, MosaicSplit split, int64_t index) {
  const bool train = split == MosaicSplit::kTrain;
  const uint64_t seed = train ? options.seed : kMosaicValidationSeed;
  const uint64_t h = combine(mix64(seed + kSplitMixGolden), train ? 0 : 1);
  return combine(h, static_cast<uint64_t>(index));
}

// ---- Fashion-MNIST files ----

std::string splitFile(const std::string& directory, MosaicSplit split, const char* kind) {
  return directory + "/" + (split == MosaicSplit::kTrain ? "train" : "t10k") + "-" + kind + "-ubyte.gz";
}

// A gzip file read from start to end in order, with the file name in every error.
class GzReader {
 public:
  explicit GzReader(std::string path) : path_(std::move(path)) {
    std::error_code ec;
    if (!std::filesystem::exists(path_, ec)) {
      throw ConfigError("mosaic dataset: Fashion-MNIST file " + path_ +
                        " is missing; install it with `apt-get install dataset-fashion-mnist` (or tools/install-deps.sh)");
    }
    file_ = gzopen(path_.c_str(), "rb");
    if (file_ == nullptr) {
      throw ConfigError("mosaic dataset: cannot open " + path_ + ": " + std::strerror(errno));
    }
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  void read(uint8_t* out, int64_t bytes) {
    int64_t done = 0;
    while (done < bytes) {
      const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(bytes - done, INT_MAX / 2));
      const int got = gzread(file_, out + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* message = gzerror(file_, &code);
        throw ConfigError("mosaic dataset: cannot read " + path_ + ": " + message);
      }
      if (got == 0) {
        throw ConfigError(detail::concat("mosaic dataset: ", path_, " is truncated: it ends after ", done,
                                         " of the ", bytes, " bytes its header announces"));
      }
      done += got;
    }
  }

  uint32_t readBigEndian32() {
    uint8_t b[4];
    read(b, 4);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

// The scaled item's pixels above the foreground level: [x0, x1) x [y0, y1),
// empty when x1 == 0.
struct TightBox {
  int64_t x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

TightBox tightBox(const std::vector<float>& item, int64_t size) {
  TightBox box{size, size, 0, 0};
  for (int64_t y = 0; y < size; ++y) {
    for (int64_t x = 0; x < size; ++x) {
      if (item[static_cast<size_t>(y * size + x)] > static_cast<float>(kMosaicForegroundLevel)) {
        box.x0 = std::min(box.x0, x);
        box.y0 = std::min(box.y0, y);
        box.x1 = std::max(box.x1, x + 1);
        box.y1 = std::max(box.y1, y + 1);
      }
    }
  }
  if (box.x1 == 0) box = TightBox{};
  return box;
}

double iou(const MosaicBox& a, const MosaicBox& b) {
  const int64_t iw = std::min(a.x + a.width, b.x + b.width) - std::max(a.x, b.x);
  const int64_t ih = std::min(a.y + a.height, b.y + b.height) - std::max(a.y, b.y);
  if (iw <= 0 || ih <= 0) return 0;
  const int64_t inter = iw * ih;
  return static_cast<double>(inter) / static_cast<double>(a.area + b.area - inter);
}

// A scaled item's level (0-255 float) as the byte an 8-bit image stores:
// rounded half up, clamped (interpolating 255 with 255 can land a hair above
// it). The only rounding of the generator: a canvas is bytes from here on,
// so that a PNG holds it exactly and a canvas read back from files is the
// generator's bit for bit (compositing by max commutes with this rounding).
uint8_t toByte(float level) {
  return static_cast<uint8_t>(std::clamp(std::floor(static_cast<double>(level) + 0.5), 0.0, 255.0));
}

using Canvas = MosaicCanvas;

Canvas drawCanvas(const MosaicOptions& options, MosaicSplit split, int64_t index) {
  if (auto problem = checkMosaicOptions(options)) throw ConfigError("mosaic dataset: " + *problem);
  PTRAIN_CHECK(index >= 0, "mosaic dataset: canvas index ", index, " is negative");
  const FashionMnistImages& source = fashionMnist(split);
  const int64_t side = options.canvas;
  SplitMix64 rng(sampleSeed(options, split, index));

  Canvas canvas;
  canvas.side = side;
  canvas.pixels.assign(static_cast<size_t>(side * side), 0);
  const int64_t items =
      options.min_items + static_cast<int64_t>(rng.below(static_cast<uint64_t>(options.max_items - options.min_items + 1)));
  for (int64_t k = 0; k < items; ++k) {
    int64_t sourceIndex = 0;
    int64_t size = 0;
    std::vector<float> item;
    TightBox tight;
    for (int attempt = 0; attempt < kSourceTries && tight.x1 == 0; ++attempt) {
      sourceIndex = static_cast<int64_t>(rng.below(static_cast<uint64_t>(source.count)));
      const double scale = options.min_scale + (options.max_scale - options.min_scale) * rng.unit();
      size = std::clamp<int64_t>(std::lround(scale * kFashionMnistSide), 1, side);
      item = mosaicScaleItem(source.image(sourceIndex), size);
      tight = tightBox(item, size);
    }
    if (tight.x1 == 0) continue;

    MosaicBox box;
    box.width = tight.x1 - tight.x0;
    box.height = tight.y1 - tight.y0;
    box.area = box.width * box.height;
    box.label = source.labels[static_cast<size_t>(sourceIndex)];
    box.source_index = sourceIndex;
    box.scale = static_cast<double>(size) / kFashionMnistSide;
    bool placed = false;
    int64_t left = 0, top = 0;
    for (int attempt = 0; attempt < kMosaicPlacementTries && !placed; ++attempt) {
      left = static_cast<int64_t>(rng.below(static_cast<uint64_t>(side - size + 1)));
      top = static_cast<int64_t>(rng.below(static_cast<uint64_t>(side - size + 1)));
      box.x = left + tight.x0;
      box.y = top + tight.y0;
      placed = std::all_of(canvas.boxes.begin(), canvas.boxes.end(),
                           [&](const MosaicBox& other) { return iou(box, other) <= options.max_iou; });
    }
    if (!placed) continue;

    // Max compositing: an item never hides the foreground of one placed
    // before it, so every box keeps pixels above the foreground level.
    for (int64_t y = 0; y < size; ++y) {
      uint8_t* row = canvas.pixels.data() + (top + y) * side + left;
      const float* from = item.data() + y * size;
      for (int64_t x = 0; x < size; ++x) row[x] = std::max(row[x], toByte(from[x]));
    }
    canvas.boxes.push_back(box);
  }
  // The first item meets an empty canvas that is wide enough for it, so only
  // a data set of blank images can leave a canvas without boxes.
  PTRAIN_CHECK(!canvas.boxes.empty(), "mosaic dataset: ", mosaicSplitName(split), " canvas ", index,
               " has no item: ", kSourceTries, " source images in a row had no pixel above level ",
               kMosaicForegroundLevel);
  return canvas;
}

// Bytes to the 0-1 scale: divided rather than multiplied by 1/255, so 255 is
// exactly 1.
void bytesToUnit(const std::vector<uint8_t>& bytes, float* out) {
  for (size_t i = 0; i < bytes.size(); ++i) out[i] = static_cast<float>(bytes[i]) / 255.0f;
}

}  // namespace

MosaicCanvas mosaicCanvas(const MosaicOptions& options, MosaicSplit split, int64_t index) {
  return drawCanvas(options, split, index);
}

const char* mosaicSplitName(MosaicSplit split) {
  return split == MosaicSplit::kTrain ? "train" : "validation";
}

FashionMnistImages loadFashionMnist(const std::string& directory, MosaicSplit split) {
  FashionMnistImages data;
  GzReader images(splitFile(directory, split, "images-idx3"));
  const uint32_t imageMagic = images.readBigEndian32();
  PTRAIN_CHECK_AS(ConfigError, imageMagic == kIdxImagesMagic, "mosaic dataset: ", images.path(),
                  " is not an IDX file of images (magic 0x", std::hex, imageMagic, ", expected 0x", kIdxImagesMagic,
                  ")");
  const int64_t count = images.readBigEndian32();
  const int64_t rows = images.readBigEndian32();
  const int64_t cols = images.readBigEndian32();
  PTRAIN_CHECK_AS(ConfigError, count > 0 && rows == kFashionMnistSide && cols == kFashionMnistSide,
                  "mosaic dataset: ", images.path(), " holds ", count, " images of ", rows, "x", cols,
                  "; expected Fashion-MNIST's 28x28");
  data.count = count;
  data.pixels.resize(static_cast<size_t>(count * kPixels));
  images.read(data.pixels.data(), count * kPixels);

  GzReader labels(splitFile(directory, split, "labels-idx1"));
  const uint32_t labelMagic = labels.readBigEndian32();
  PTRAIN_CHECK_AS(ConfigError, labelMagic == kIdxLabelsMagic, "mosaic dataset: ", labels.path(),
                  " is not an IDX file of labels (magic 0x", std::hex, labelMagic, ", expected 0x", kIdxLabelsMagic,
                  ")");
  const int64_t labelCount = labels.readBigEndian32();
  PTRAIN_CHECK_AS(ConfigError, labelCount == count, "mosaic dataset: ", labels.path(), " holds ", labelCount,
                  " labels for the ", count, " images of ", images.path());
  data.labels.resize(static_cast<size_t>(count));
  labels.read(data.labels.data(), count);
  for (int64_t i = 0; i < count; ++i) {
    PTRAIN_CHECK_AS(ConfigError, data.labels[static_cast<size_t>(i)] < kFashionMnistClasses, "mosaic dataset: ",
                    labels.path(), ": label ", int{data.labels[static_cast<size_t>(i)]}, " of image ", i,
                    " is not a Fashion-MNIST class (0-9)");
  }
  return data;
}

const FashionMnistImages& fashionMnist(MosaicSplit split) {
  // A mutex rather than std::call_once: a failed load must leave the slot
  // empty for a later retry, and call_once's exceptional path has been
  // unreliable in some libstdc++ releases.
  static std::mutex mutex;
  static std::unique_ptr<FashionMnistImages> loaded[2];
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<FashionMnistImages>& slot = loaded[split == MosaicSplit::kTrain ? 0 : 1];
  if (!slot) slot = std::make_unique<FashionMnistImages>(loadFashionMnist(kFashionMnistDir, split));
  return *slot;
}

std::optional<std::string> checkMosaicOptions(const MosaicOptions& o) {
  using detail::concat;
  if (o.min_items < 1) return concat("min_items=", o.min_items, " is below 1; a canvas holds at least one item");
  if (o.max_items < o.min_items) {
    return concat("max_items=", o.max_items, " is below min_items=", o.min_items);
  }
  if (!(o.min_scale > 0) || !(o.max_scale >= o.min_scale) || !std::isfinite(o.max_scale)) {
    return concat("the scale range [", o.min_scale, ", ", o.max_scale, "] is not a range of positive numbers");
  }
  if (!(o.max_iou >= 0 && o.max_iou <= 1)) return concat("max_iou=", o.max_iou, " is outside [0, 1]");
  const int64_t largest = std::max<int64_t>(1, std::lround(o.max_scale * kFashionMnistSide));
  if (o.canvas < largest || o.canvas > 65536) {
    return concat("canvas=", o.canvas, " cannot hold an item at max_scale=", o.max_scale, " (", largest,
                  " pixels); use ", largest, "..65536");
  }
  return std::nullopt;
}

std::vector<float> mosaicScaleItem(const uint8_t* image, int64_t size) {
  PTRAIN_CHECK(size >= 1, "mosaic dataset: item size ", size, " is below 1");
  constexpr int64_t n = kFashionMnistSide;
  // Source coordinate of each output row/column (the same both ways for a
  // square): half-pixel centres, negative ones clamped to 0 as libtorch's
  // bilinear interpolate does with align_corners=false.
  const double ratio = static_cast<double>(n) / static_cast<double>(size);
  std::vector<int64_t> lo(static_cast<size_t>(size)), hi(static_cast<size_t>(size));
  std::vector<float> frac(static_cast<size_t>(size));
  for (int64_t o = 0; o < size; ++o) {
    const double c = std::max(0.0, (static_cast<double>(o) + 0.5) * ratio - 0.5);
    const int64_t i = std::min<int64_t>(static_cast<int64_t>(c), n - 1);
    lo[static_cast<size_t>(o)] = i;
    hi[static_cast<size_t>(o)] = std::min<int64_t>(i + 1, n - 1);
    frac[static_cast<size_t>(o)] = static_cast<float>(c - static_cast<double>(i));
  }
  std::vector<float> out(static_cast<size_t>(size * size));
  for (int64_t y = 0; y < size; ++y) {
    const uint8_t* top = image + lo[static_cast<size_t>(y)] * n;
    const uint8_t* bottom = image + hi[static_cast<size_t>(y)] * n;
    const float fy = frac[static_cast<size_t>(y)];
    for (int64_t x = 0; x < size; ++x) {
      const int64_t x0 = lo[static_cast<size_t>(x)], x1 = hi[static_cast<size_t>(x)];
      const float fx = frac[static_cast<size_t>(x)];
      const float upper = (1 - fx) * static_cast<float>(top[x0]) + fx * static_cast<float>(top[x1]);
      const float lower = (1 - fx) * static_cast<float>(bottom[x0]) + fx * static_cast<float>(bottom[x1]);
      out[static_cast<size_t>(y * size + x)] = (1 - fy) * upper + fy * lower;
    }
  }
  return out;
}

MosaicSample mosaicSample(const MosaicOptions& options, MosaicSplit split, int64_t index) {
  Canvas canvas = drawCanvas(options, split, index);
  const int64_t side = options.canvas;
  MosaicSample sample;
  sample.image = torch::empty({1, side, side}, torch::kFloat32);
  bytesToUnit(canvas.pixels, sample.image.data_ptr<float>());
  sample.boxes = std::move(canvas.boxes);
  return sample;
}

Batch mosaicBatch(const MosaicOptions& options, MosaicSplit split, int64_t first, int64_t count) {
  PTRAIN_CHECK(first >= 0 && count >= 0, "mosaic dataset: batch of ", count, " canvases from ", first,
               " (both must be >= 0)");
  DetectionBatchWriter writer(count, options.canvas, options.max_items);
  for (int64_t r = 0; r < count; ++r) {
    const Canvas canvas = drawCanvas(options, split, first + r);
    writer.setRow(r, canvas.pixels, canvas.boxes);
  }
  return writer.finish();
}

DetectionBatchWriter::DetectionBatchWriter(int64_t count, int64_t side, int64_t slots)
    : side_(side),
      slots_(slots),
      images_(torch::empty({count, 1, side, side}, torch::kFloat32)),
      boxes_(torch::zeros({count, slots, 4}, torch::kFloat32)),
      labels_(torch::full({count, slots}, -1, torch::kInt64)),
      counts_(torch::zeros({count}, torch::kInt64)) {}

void DetectionBatchWriter::setPixels(int64_t r, const std::vector<uint8_t>& pixels) {
  PTRAIN_CHECK(static_cast<int64_t>(pixels.size()) == side_ * side_, "detection batch: row ", r, " has ",
               pixels.size(), " pixels, not ", side_ * side_);
  bytesToUnit(pixels, images_.data_ptr<float>() + r * side_ * side_);
}

void DetectionBatchWriter::setBox(int64_t r, int64_t k, int64_t x, int64_t y, int64_t width, int64_t height,
                                  int64_t label) {
  float* row = boxes_.data_ptr<float>() + (r * slots_ + k) * 4;
  row[0] = static_cast<float>(x);
  row[1] = static_cast<float>(y);
  row[2] = static_cast<float>(width);
  row[3] = static_cast<float>(height);
  labels_.data_ptr<int64_t>()[r * slots_ + k] = label;
}

void DetectionBatchWriter::setCount(int64_t r, int64_t n) { counts_.data_ptr<int64_t>()[r] = n; }

Batch DetectionBatchWriter::finish() {
  Batch batch;
  batch.tensors.emplace("images", images_);
  batch.tensors.emplace("boxes", boxes_);
  batch.tensors.emplace("labels", labels_);
  batch.tensors.emplace("box_counts", counts_);
  return batch;
}

void writeCocoGroundTruth(const std::string& path, const MosaicOptions& options, int64_t count) {
  PTRAIN_CHECK(count >= 0, "mosaic dataset: COCO export of ", count, " canvases");
  nlohmann::json images = nlohmann::json::array();
  nlohmann::json annotations = nlohmann::json::array();
  int64_t annotationId = 1;
  for (int64_t i = 0; i < count; ++i) {
    const Canvas canvas = drawCanvas(options, MosaicSplit::kValidation, i);
    std::ostringstream name;
    name << "mosaic_val_" << std::setw(6) << std::setfill('0') << i << ".png";
    images.push_back({{"id", i}, {"width", options.canvas}, {"height", options.canvas}, {"file_name", name.str()}});
    for (const MosaicBox& b : canvas.boxes) {
      annotations.push_back({{"id", annotationId++},
                             {"image_id", i},
                             {"category_id", mosaicCocoCategoryId(b.label)},
                             {"bbox", {b.x, b.y, b.width, b.height}},
                             {"area", b.area},
                             {"iscrowd", 0}});
    }
  }
  nlohmann::json categories = nlohmann::json::array();
  for (int64_t label = 0; label < kFashionMnistClasses; ++label) {
    categories.push_back(
        {{"id", mosaicCocoCategoryId(label)}, {"name", kFashionMnistClassNames[label]}, {"supercategory", "fashion"}});
  }
  const nlohmann::json document = {{"info", {{"description", "ptrain mosaic validation canvases (Fashion-MNIST test split)"}}},
                                   {"images", images},
                                   {"annotations", annotations},
                                   {"categories", categories}};
  std::ofstream out(path);
  out << document.dump() << '\n';
  out.close();
  PTRAIN_CHECK_AS(ConfigError, static_cast<bool>(out), "mosaic dataset: cannot write the COCO ground truth to ", path,
                  ": ", std::strerror(errno));
}

}  // namespace ptrain::datasets

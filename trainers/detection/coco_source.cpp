#include "coco_source.h"

#include <sys/stat.h>

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "ptrain/core/error.h"
#include "ptrain/datasets/mosaic.h"
#include "ptrain/datasets/splitmix.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ptrain::detection {

namespace {

json fileStamp(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return json{{"path", path}};
  const int64_t mtimeNs = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return json{{"path", path}, {"bytes", static_cast<int64_t>(st.st_size)}, {"mtime_ns", mtimeNs}};
}

int64_t mostBoxes(const datasets::CocoDataset& data, int64_t* where) {
  int64_t most = 0;
  for (int64_t i = 0; i < data.size(); ++i) {
    const int64_t n = static_cast<int64_t>(data.info(i).boxes.size());
    if (n > most) most = n, *where = i;
  }
  return most;
}

}  // namespace

CocoSource::CocoSource(const CocoSourceOptions& options) : options_(options) {
  std::error_code ec;
  if (options.path.empty()) {
    throw ConfigError("not set; data.name: coco reads a COCO folder (annotations/instances_train.json, "
                      "annotations/instances_validation.json, images/), e.g. data.path: data/mosaic_coco");
  }
  if (!fs::is_directory(options.path, ec)) {
    throw ConfigError(options.path + " is not a folder; write one with `ptrain data export mosaic " + options.path +
                      " --recipe R`, or point data.path at a COCO folder");
  }
  const fs::path root(options.path);
  datasets::CocoDatasetOptions dataOptions;
  dataOptions.on_image_open = options.on_image_open;
  const std::string images = (root / options.images).string();
  train_ = std::make_unique<datasets::CocoDataset>((root / options.train_annotations).string(), images, dataOptions);
  validation_ =
      std::make_unique<datasets::CocoDataset>((root / options.validation_annotations).string(), images, dataOptions);
  for (const datasets::CocoDataset* d : {train_.get(), validation_.get()}) {
    d->checkImageFiles();
    const int64_t categories = static_cast<int64_t>(d->categories().size());
    if (categories > options.classes) {
      throw ConfigError(d->annotationsFile() + " has " + std::to_string(categories) +
                        " categories, more than the model's " + std::to_string(options.classes) + " classes");
    }
  }
  if (train_->size() == 0) throw ConfigError(train_->annotationsFile() + " lists no image to train on");
  const auto& a = train_->categories();
  const auto& b = validation_->categories();
  bool same = a.size() == b.size();
  for (size_t i = 0; same && i < a.size(); ++i) same = a[i].id == b[i].id;
  if (!same) {
    throw ConfigError(validation_->annotationsFile() + ": its category ids are not those of " +
                      train_->annotationsFile() + "; the labels would mean other classes");
  }
  int64_t trainAt = 0, validationAt = 0;
  const int64_t trainMost = mostBoxes(*train_, &trainAt);
  const int64_t validationMost = mostBoxes(*validation_, &validationAt);
  slots_ = options.max_boxes > 0 ? options.max_boxes : std::max<int64_t>(1, std::max(trainMost, validationMost));
  for (const auto& [d, most, at] : {std::tuple{train_.get(), trainMost, trainAt},
                                    std::tuple{validation_.get(), validationMost, validationAt}}) {
    if (most > slots_) {
      throw ConfigError(d->annotationsFile() + ": image id " + std::to_string(d->info(at).id) + " has " +
                        std::to_string(most) + " boxes, more than data.max_boxes=" + std::to_string(slots_) +
                        "; raise it (0: the most any image holds)");
    }
  }
}

int64_t CocoSource::categoryId(int64_t label) const {
  PTRAIN_CHECK(label >= 0 && label < static_cast<int64_t>(train_->categories().size()), "coco source: label ",
               label, " has no category");
  return train_->categories()[static_cast<size_t>(label)].id;
}

int64_t CocoSource::trainIndex(int64_t sample) {
  PTRAIN_CHECK(sample >= 0, "coco source: sample ", sample, " is negative");
  const int64_t n = train_->size();
  const int64_t epoch = sample / n, position = sample % n;
  if (!options_.shuffle) return position;
  auto it = permutations_.find(epoch);
  if (it == permutations_.end()) {
    // A batch spans at most two epochs: keep the latest two.
    while (permutations_.size() >= 2) permutations_.erase(permutations_.begin());
    it = permutations_.emplace(epoch, datasets::epochPermutation(n, options_.seed, epoch)).first;
  }
  return it->second[static_cast<size_t>(position)];
}

Batch CocoSource::rows(const datasets::CocoDataset& data, const std::vector<int64_t>& indices) const {
  const int64_t count = static_cast<int64_t>(indices.size());
  // The generator's own layout (mosaic.h), so equal bytes give equal batches.
  datasets::DetectionBatchWriter writer(count, options_.canvas, slots_);
  for (int64_t r = 0; r < count; ++r) {
    const datasets::CocoSample s = data.sample(indices[static_cast<size_t>(r)], options_.canvas, 1);
    writer.setRow(r, s.canvas.pixels, s.canvas.boxes);
  }
  return writer.finish();
}

Batch CocoSource::trainRows(int64_t first, int64_t count) {
  std::vector<int64_t> indices(static_cast<size_t>(count));
  for (int64_t r = 0; r < count; ++r) indices[static_cast<size_t>(r)] = trainIndex(first + r);
  return rows(*train_, indices);
}

Batch CocoSource::validationRows(int64_t first, int64_t count) const {
  std::vector<int64_t> indices(static_cast<size_t>(count));
  std::iota(indices.begin(), indices.end(), first);
  return rows(*validation_, indices);
}

std::vector<GroundTruth> CocoSource::validationTruth(int64_t count) const {
  std::vector<GroundTruth> truth;
  for (int64_t i = 0; i < count; ++i) {
    const datasets::CocoImageInfo& info = validation_->info(i);
    // The letterbox's boxes depend only on the image's size: a blank image
    // of that size gives them without reading the file.
    datasets::Image blank;
    blank.width = info.width;
    blank.height = info.height;
    blank.channels = 1;
    blank.bytes.assign(static_cast<size_t>(info.width * info.height), 0);
    for (const datasets::CanvasBox& b : datasets::letterbox(blank, info.boxes, options_.canvas).boxes) {
      GroundTruth gt;
      gt.image_id = i;
      gt.category_id = categoryId(b.label);
      gt.bbox = Box{static_cast<double>(b.x), static_cast<double>(b.y), static_cast<double>(b.width),
                    static_cast<double>(b.height)};
      gt.area = static_cast<double>(b.area);
      truth.push_back(gt);
    }
  }
  return truth;
}

json CocoSource::position(int64_t consumed) const {
  return json{{"source", "coco"},
              {"files", {fileStamp(train_->annotationsFile()), fileStamp(validation_->annotationsFile())}},
              {"shuffle", options_.shuffle},
              {"seed", options_.seed},
              {"consumed_samples", consumed}};
}

std::optional<std::string> CocoSource::differs(const json& saved) const {
  if (!saved.is_object() || saved.value("source", "") != "coco") {
    return std::string("the checkpoint's run read another data set (data.name changed to coco)");
  }
  const json now = position(0);
  if (saved.value("files", json()) != now.at("files")) {
    return std::string("the annotation files changed since the checkpoint (their paths, sizes or times differ): "
                       "resuming would not continue the same images in the same order; restore them, or start a "
                       "new run with checkpoint.load");
  }
  for (const char* key : {"shuffle", "seed"}) {
    if (saved.value(key, json()) != now.at(key)) {
      return std::string("the training order changed since the checkpoint: ") +
             (std::string(key) == "seed" ? "train.seed" : "data.shuffle") + " was " + saved.value(key, json()).dump() +
             " and is " + now.at(key).dump() + "; set it back, or start a new run with checkpoint.load";
    }
  }
  return std::nullopt;
}

}  // namespace ptrain::detection

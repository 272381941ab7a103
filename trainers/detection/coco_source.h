// CocoSource: the detection trainer's data from files (data.name: coco), a
// COCO folder as CocoWriter (and `ptrain data export mosaic`) writes it:
//   <path>/annotations/instances_train.json       the training images
//   <path>/annotations/instances_validation.json  the evaluation images
//   <path>/images/                                the image files
// (each name can be given instead: data.train_annotations,
// data.validation_annotations, data.images, relative to data.path).
//
// Every image is letterboxed into the recipe's canvas (CocoDataset::sample:
// top-left, bilinear, rounded to bytes), grey, and handed to the model as
// byte / 255, exactly as the mosaic generator hands its canvases over; its
// labels are the ascending-id category positions. So a folder of exported
// mosaics read with shuffle off gives the generator's batches bit for bit.
//
// Training order: sample i (= step * global_batch + row) is image i % N of
// epoch i / N (N training images), in file (ascending id) order, or, with
// shuffle, at position i % N of epoch e's permutation: a Fisher-Yates
// shuffle of 0..N-1 drawn from splitmix64 seeded by (seed, e). One
// permutation (N integers) is kept at a time per epoch asked for.
//
// A rank opens only the image files of the rows it asks for.
//
// Thread-safety: one thread at a time (the permutation cache is not locked).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coco_eval.h"
#include "ptrain/datasets/coco_dataset.h"
#include "ptrain/engine/batch.h"

namespace ptrain::detection {

struct CocoSourceOptions {
  std::string path;  // the folder (data.path)
  std::string train_annotations = "annotations/instances_train.json";  // relative to path
  std::string validation_annotations = "annotations/instances_validation.json";
  std::string images = "images";
  int64_t canvas = 128;
  int64_t classes = 10;    // the model's classes: more categories are refused
  int64_t max_boxes = 0;   // box slots per image in a batch; 0: the most any image of the files holds
  bool shuffle = true;
  uint64_t seed = 0;       // train.seed
  // Tests: called as each image file is opened (CocoDatasetOptions::on_image_open).
  std::function<void(int64_t index, const std::string& path)> on_image_open;
};

class CocoSource {
 public:
  // Reads both annotation files (no image is opened) and stats every image
  // file. Throws ConfigError, one line naming the file: a missing folder or
  // file, malformed JSON, missing image files, more categories than classes,
  // the two files with different categories, an image with more boxes than
  // max_boxes.
  explicit CocoSource(const CocoSourceOptions& options);

  const CocoSourceOptions& options() const { return options_; }
  int64_t trainSize() const { return train_->size(); }
  int64_t validationSize() const { return validation_->size(); }
  // Box slots of a batch row ("boxes" [n, slots, 4], "labels" [n, slots]).
  int64_t slots() const { return slots_; }
  // The COCO category id of label (0..C-1).
  int64_t categoryId(int64_t label) const;

  // The training image index of sample `sample` (see the order above).
  int64_t trainIndex(int64_t sample);
  // Samples [first, first + count) of the training order, as the mosaic
  // batch's tensors: images [n, 1, C, C] float32, boxes, labels, box_counts.
  Batch trainRows(int64_t first, int64_t count);
  // Validation images [first, first + count), in file order.
  Batch validationRows(int64_t first, int64_t count) const;
  // The letterboxed boxes of validation images 0..count-1 in canvas pixels,
  // image_id = the index (no image file is read).
  std::vector<GroundTruth> validationTruth(int64_t count) const;

  // What a checkpoint records: the annotation files (path, size, mtime),
  // shuffle, seed and `consumed` samples.
  nlohmann::json position(int64_t consumed) const;
  // Why continuing after `saved` would not continue this order (nullopt: it would).
  std::optional<std::string> differs(const nlohmann::json& saved) const;

  // Image files opened so far from the training / validation files.
  int64_t trainImagesOpened() const { return train_->imagesOpened(); }
  int64_t validationImagesOpened() const { return validation_->imagesOpened(); }

 private:
  Batch rows(const datasets::CocoDataset& data, const std::vector<int64_t>& indices) const;

  CocoSourceOptions options_;
  std::unique_ptr<datasets::CocoDataset> train_;
  std::unique_ptr<datasets::CocoDataset> validation_;
  int64_t slots_ = 0;
  std::map<int64_t, std::vector<int64_t>> permutations_;  // epoch -> order (at most two kept)
};

}  // namespace ptrain::detection

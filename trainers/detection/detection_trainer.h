// DetectionTrainer: the `detection` trainer plugin. A CenterNet detector
// (centernet.h) learns to find Fashion-MNIST items on mosaic canvases
// (ptrain/datasets/mosaic.h), or objects in a COCO folder (data.name: coco,
// coco_source.h); its metrics are COCO's box AP and AR on the first
// data.eval_size validation canvases / images (coco_eval.h).
//
// Keys it reads (docs/trainers/detection.md): model.num_layers (blocks),
// model.hidden_size (block and head channels), model.ffn_hidden_size
// (channels inside a block, the tensor-parallel split; 0: 2 * hidden_size),
// model.stem_channels, model.size_loss_weight, model.offset_loss_weight,
// model.max_detections, model.class_loss_weight; data.canvas, data.min_items, data.max_items,
// data.min_scale, data.max_scale, data.max_iou, data.eval_size; with
// data.name: coco instead of the canvas keys but data.canvas: data.path,
// data.train_annotations, data.validation_annotations, data.images,
// data.max_boxes, data.shuffle; train.seed seeds the training canvases (the
// shuffle of the files).
//
// Thread-safety: one thread at a time, like every trainer.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "centernet.h"
#include "coco_source.h"
#include "ptrain/datasets/mosaic.h"
#include "ptrain/engine/model_trainer.h"

namespace ptrain::detection {

class DetectionTrainer : public ModelTrainer<CenterNetModel> {
 public:
  explicit DetectionTrainer(const PluginContext& context);
  ~DetectionTrainer() override;

  void describeKeys(Schema& schema) const override;
  // Throws ConfigError (via recipe.fail, naming the key) for a dataset other
  // than mosaic, transformer or MoE keys this model does not have, canvas
  // options the dataset refuses, or a canvas not divisible by the stride.
  void setup(const Recipe& recipe) override;
  // Training canvases step * size .. step * size + size - 1, with their
  // CenterNet targets (addCenterNetTargets).
  Batch globalBatch(int64_t step, int64_t globalBatchSize) override;
  Batch batchRows(int64_t step, int64_t globalBatchSize, int64_t begin, int64_t end) override;
  // Objects in the batch: the loss is normalised by their number.
  double lossCount(const Batch& batch) const override;
  // Canvases (samples) in the batch.
  double tokensIn(const Batch& batch) const override;  // canvases
  const char* throughputUnit() const override { return "images"; }
  // Model FLOPs of training on `images` canvases: 6 x centerNetMultiplyAdds
  // per image at data.canvas (convolutions only; 0 before setup()).
  double trainFlops(double images) const override;
  // The engine's loop; it only remembers the run folder for evaluate().
  TrainSummary train(TrainingSession& session) override;

  // {"mosaic"}: the built-in canvases as a COCO folder (data.name: coco
  // reads it back, with data.shuffle: false, as the generator's batches).
  std::vector<std::string> exportableData() const override { return {"mosaic"}; }
  // Training canvases 0..train-1 (the recipe's train.seed; 0: train.steps x
  // train.global_batch_size) and validation canvases 0..validation-1 (0:
  // data.eval_size) as grey PNGs mosaic_<split>_<index>.png with their boxes
  // (whole pixels), categories 1-10 named as Fashion-MNIST's classes. Prints
  // one line with the counts. Throws ConfigError for another name, a recipe
  // that does not read the mosaics, or an existing non-empty `out`.
  void exportData(const std::string& name, const std::string& out, int64_t train, int64_t validation) const override;
  // Files (data.name: coco): the annotation files' stamps, shuffle, seed and
  // samples consumed; null for the generator.
  nlohmann::json dataPosition(int64_t step, int64_t globalBatchSize) const override;
  std::optional<std::string> checkDataPosition(const nlohmann::json& saved, int64_t step,
                                               int64_t globalBatchSize) const override;

  // The file source (data.name: coco), or nullptr; for tests.
  CocoSource* cocoSource() const { return coco_.get(); }

  const CenterNetConfig& modelConfig() const { return config_; }
  const datasets::MosaicOptions& dataOptions() const { return data_; }

 protected:
  std::shared_ptr<CenterNetModel> makeModel(const ModelBuild& build) override;
  // eval_map (AP@[.5:.95]), eval_map50, eval_map75, eval_ar100 of the
  // decoded detections on validation canvases 0..eval_size-1, and eval_loss.
  // Each data-parallel rank decodes a contiguous shard; the fixed-size
  // detections are summed into one tensor with ctx.all_reduce_sum, so every
  // rank scores all of them. Rank 0 writes RUN_DIR/detections.json (the
  // latest evaluation, COCO results) and RUN_DIR/coco_gt.json beside it.
  std::map<std::string, double> evaluateModel(CenterNetModel& net, const EvalContext& ctx) override;

 private:

  CenterNetConfig config_;
  datasets::MosaicOptions data_;
  std::unique_ptr<CocoSource> coco_;  // data.name: coco
  int64_t train_samples_ = 0;         // train.steps x train.global_batch_size
  int64_t eval_size_ = 0;
  int64_t max_detections_ = 100;
  bool ready_ = false;
  int rank_ = 0;
  int world_size_ = 1;
  std::string run_dir_;
  bool wrote_ground_truth_ = false;
  std::vector<GroundTruth> ground_truth_;  // of validation canvases 0..eval_size-1, made at the first evaluation
};

}  // namespace ptrain::detection

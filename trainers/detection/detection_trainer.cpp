#include "detection_trainer.h"

#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <numeric>

#include "ptrain/comm/rank_env.h"
#include "ptrain/engine/engine.h"
#include "picture.h"
#include "ptrain/datasets/coco_dataset.h"
#include "ptrain/recipe/key_specs.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain::detection {

using datasets::MosaicSplit;

namespace {

// Canvases decoded in one forward pass: bounds the activation memory of
// evaluation whatever data.eval_size is.
constexpr int64_t kEvalChunk = 64;
// predictions.png: the first 8 validation canvases, 4 to a row, twice their
// size; detections scoring at least 0.3 (below that, peaks the evaluation
// ranks low anyway).
constexpr int64_t kPictureCanvases = 8;
constexpr int64_t kPictureColumns = 4;
constexpr double kPictureMinScore = 0.3;

}  // namespace

DetectionTrainer::DetectionTrainer(const PluginContext& context)
    : rank_(context.rank), world_size_(std::max(1, context.world_size)) {}

DetectionTrainer::~DetectionTrainer() = default;

void DetectionTrainer::describeKeys(Schema& schema) const {
  using T = ValueType;
  using keys::above;
  using keys::atLeast;
  using keys::atMost;
  using keys::key;

  // The transformer's shape names, read as the detector's: blocks, channels,
  // and the channels inside a block. Whole blocks are recomputed (no
  // selective recomputation: there is no attention core).
  schema.add(atLeast(key("model.num_layers", T::kInt, "2", "Residual blocks of the detector's body."), 1));
  schema.add(atLeast(key("model.hidden_size", T::kInt, "32",
                         "Channels of the detector's body (split across tensor-parallel ranks)."),
                     1));
  schema.add(atLeast(key("model.ffn_hidden_size", T::kInt, "0",
                         "Channels inside each residual block; 0 means 2 * hidden_size."),
                     0));
  keys::addRecompute(schema, /*selective=*/false);
  schema.add(atLeast(key("model.stem_channels", T::kInt, "16",
                         "Channels of the first stride-2 convolution of the detector's stem (the second gives "
                         "model.hidden_size)."),
                     1));
  schema.add(atLeast(key("model.size_loss_weight", T::kFloat, "0.1",
                         "Weight of the L1 loss on box width and height (in output cells) at object centres."),
                     0));
  schema.add(atLeast(key("model.offset_loss_weight", T::kFloat, "1.0",
                         "Weight of the L1 loss on the sub-cell offset of object centres."),
                     0));
  schema.add(atLeast(key("model.class_loss_weight", T::kFloat, "0",
                         "Weight of a softmax cross-entropy over the class logits at each object's centre cell, "
                         "beside CenterNet's focal loss (0: off); makes confusable classes compete where an object "
                         "is."),
                     0));
  schema.add(key("model.block_stride", T::kInt, "4",
                 "Stride at which the blocks run: 4 (the output stride) or 8 (a third stride-2 stem convolution; "
                 "the head upsamples back to 4)."));
  schema.add(atLeast(key("model.head_channels", T::kInt, "0",
                         "Channels of the head's 3x3 features at stride 4; 0: model.hidden_size."),
                     0));
  schema.add(key("model.block_dilations", T::kIntList, "[1]",
                 "Dilation of each block's 3x3 convolution, cycled over the blocks (block i takes entry i modulo "
                 "the list's length): [1, 2, 4] sees 71 pixels after three blocks instead of 39."));
  schema.add(atLeast(key("model.max_detections", T::kInt, "100",
                         "Detections kept per canvas at evaluation: the highest heatmap peaks over all classes."),
                     1));

  schema.add(atLeast(key("data.canvas", T::kInt, "128",
                         "Mosaic canvas side in pixels; a multiple of 4 (the detector's output stride)."),
                     28));
  schema.add(atLeast(key("data.min_items", T::kInt, "1", "Fewest items drawn per mosaic canvas."), 1));
  schema.add(atLeast(key("data.max_items", T::kInt, "6",
                         "Most items drawn per mosaic canvas (items that find no place are dropped)."),
                     1));
  schema.add(above(key("data.min_scale", T::kFloat, "0.75", "Smallest item scale (28 pixels = 1)."), 0));
  schema.add(above(key("data.max_scale", T::kFloat, "2.0", "Largest item scale (28 pixels = 1)."), 0));
  schema.add(atMost(atLeast(key("data.max_iou", T::kFloat, "0.3", "Most two boxes of one canvas may overlap (IoU)."),
                            0),
                    1));
  schema.add(key("data.path", T::kString, "",
                 "data.name coco: the COCO folder to train from (annotations/instances_train.json, "
                 "annotations/instances_validation.json, images/: what `ptrain data export mosaic` writes)."));
  schema.add(key("data.train_annotations", T::kString, "annotations/instances_train.json",
                 "data.name coco: the training images' instances file, relative to data.path."));
  schema.add(key("data.validation_annotations", T::kString, "annotations/instances_validation.json",
                 "data.name coco: the evaluation images' instances file, relative to data.path."));
  schema.add(key("data.images", T::kString, "images",
                 "data.name coco: the folder the instances files' file_name entries are relative to, relative "
                 "to data.path."));
  schema.add(atLeast(key("data.max_boxes", T::kInt, "0",
                         "data.name coco: box slots per image in a batch (more boxes are refused); 0: the most any "
                         "image of the files holds. Set it to the mosaic recipe's data.max_items for its batches "
                         "bit for bit."),
                     0));
  schema.add(key("data.shuffle", T::kBool, "true",
                 "data.name coco: visit the training images in a new order each epoch (seeded by train.seed and "
                 "the epoch); false: file order (ascending image id)."));
  schema.add(atLeast(key("data.eval_size", T::kInt, "256",
                         "Validation canvases (0..eval_size-1) scored with COCO AP/AR, split across data-parallel "
                         "ranks."),
                     0));
}

void DetectionTrainer::setup(const Recipe& recipe) {
  const std::string name = recipe.has("data.name") ? recipe.getString("data.name") : "";
  const bool files = name == "coco";
  if (!name.empty() && name != "mosaic" && !files) {
    recipe.fail("data.name", "'" + name + "' is not a dataset of the detection trainer; use mosaic (built in) or "
                             "coco (a COCO folder, data.path)");
  }
  // Keys of the other source would be silently unread.
  for (const char* key : files ? std::vector<const char*>{"data.min_items", "data.max_items", "data.min_scale",
                                                           "data.max_scale", "data.max_iou"}
                               : std::vector<const char*>{"data.path", "data.train_annotations",
                                                          "data.validation_annotations", "data.images",
                                                          "data.max_boxes", "data.shuffle"}) {
    if (recipe.isExplicit(key)) {
      recipe.fail(key, std::string("is read only with data.name: ") + (files ? "mosaic" : "coco") +
                           "; remove it, or set data.name: " + (files ? "mosaic" : "coco"));
    }
  }
  if (recipe.getBool("parallel.sequence_parallel")) {
    recipe.fail("parallel.sequence_parallel", "the detection trainer's model has no sequence to split; set it false");
  }

  datasets::MosaicOptions data;
  data.canvas = recipe.getInt("data.canvas");
  data.min_items = recipe.getInt("data.min_items");
  data.max_items = recipe.getInt("data.max_items");
  data.min_scale = recipe.getFloat("data.min_scale");
  data.max_scale = recipe.getFloat("data.max_scale");
  data.max_iou = recipe.getFloat("data.max_iou");
  data.seed = static_cast<uint64_t>(recipe.getInt("train.seed"));
  if (data.canvas % kOutputStride != 0) {
    recipe.fail("data.canvas", std::to_string(data.canvas) + " is not a multiple of the output stride " +
                                   std::to_string(kOutputStride) + "; use e.g. " +
                                   std::to_string(data.canvas / kOutputStride * kOutputStride));
  }
  if (!files) {
    if (auto problem = datasets::checkMosaicOptions(data)) recipe.fail("data", *problem);
  }
  {
    // One rank's micro-batch of canvases alone, before any activation: a size
    // no host holds is refused here, so that `ptrain check` refuses it as the
    // run would (the out-of-memory class, exit code 3).
    const int64_t global = recipe.getInt("train.global_batch_size");
    const int64_t rows = recipe.has("train.micro_batch_size") ? recipe.getInt("train.micro_batch_size")
                                                               : (global + world_size_ - 1) / world_size_;
    const double bytes = static_cast<double>(rows) * static_cast<double>(data.canvas) *
                         static_cast<double>(data.canvas) * sizeof(float);
    const double host = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    if (host > 0 && bytes > host) {
      char sizes[96];
      std::snprintf(sizes, sizeof sizes, "%.1f GB before the model sees it, and this host has %.1f GB", bytes / 1e9,
                    host / 1e9);
      throw OutOfMemoryError(recipe.location("data.canvas").str() + ": data.canvas: " + std::to_string(data.canvas) +
                             ": one micro-batch of " + std::to_string(rows) + " canvases is " + sizes +
                             "; use a smaller canvas or micro-batch");
    }
  }

  CenterNetConfig c;
  c.classes = datasets::kFashionMnistClasses;
  c.num_blocks = recipe.has("model.num_layers") ? recipe.getInt("model.num_layers") : 2;
  c.channels = recipe.has("model.hidden_size") ? recipe.getInt("model.hidden_size") : 32;
  const int64_t inner = recipe.getInt("model.ffn_hidden_size");
  c.inner_channels = inner > 0 ? inner : 2 * c.channels;
  c.stem_channels = recipe.getInt("model.stem_channels");
  c.dilations = recipe.getIntList("model.block_dilations");
  c.block_stride = recipe.getInt("model.block_stride");
  if (c.block_stride != 4 && c.block_stride != 8) {
    recipe.fail("model.block_stride", std::to_string(c.block_stride) + " is not a stride the detector runs; use 4 or 8");
  }
  if (data.canvas % c.block_stride != 0) {
    recipe.fail("data.canvas", std::to_string(data.canvas) + " is not a multiple of model.block_stride=" +
                                   std::to_string(c.block_stride) + "; use e.g. " +
                                   std::to_string(data.canvas / c.block_stride * c.block_stride));
  }
  c.head_channels = recipe.getInt("model.head_channels") > 0 ? recipe.getInt("model.head_channels") : c.channels;
  c.size_weight = recipe.getFloat("model.size_loss_weight");
  c.offset_weight = recipe.getFloat("model.offset_loss_weight");
  c.class_weight = recipe.getFloat("model.class_loss_weight");
  const int64_t tp = recipe.getInt("parallel.tensor_model_parallel_size");
  if (c.inner_channels % tp != 0) {
    recipe.fail("model.ffn_hidden_size", "the block's inner channels (" + std::to_string(c.inner_channels) +
                                             ") are not divisible by parallel.tensor_model_parallel_size=" +
                                             std::to_string(tp));
  } else if (normGroups(c.inner_channels) % tp != 0) {
    recipe.fail("model.ffn_hidden_size",
                "the block's group norm has " + std::to_string(normGroups(c.inner_channels)) + " groups of " +
                    std::to_string(c.inner_channels / normGroups(c.inner_channels)) +
                    " channels, which parallel.tensor_model_parallel_size=" + std::to_string(tp) +
                    " cannot split without cutting a group; use a multiple of " +
                    std::to_string(kChannelsPerGroup * tp) + " inner channels");
  }
  if (c.dilations.empty()) recipe.fail("model.block_dilations", "give at least one dilation, e.g. [1]");
  for (int64_t d : c.dilations) {
    if (d < 1) recipe.fail("model.block_dilations", "dilation " + std::to_string(d) + " must be >= 1 (1: none)");
  }

  std::unique_ptr<CocoSource> coco;
  if (files) {
    CocoSourceOptions o;
    o.path = recipe.getString("data.path");
    o.train_annotations = recipe.getString("data.train_annotations");
    o.validation_annotations = recipe.getString("data.validation_annotations");
    o.images = recipe.getString("data.images");
    o.canvas = data.canvas;
    o.classes = c.classes;
    o.max_boxes = recipe.getInt("data.max_boxes");
    o.shuffle = recipe.getBool("data.shuffle");
    o.seed = data.seed;
    try {
      coco = std::make_unique<CocoSource>(o);
    } catch (const ConfigError& e) {
      recipe.fail("data.path", e.what());
    }
  }

  // Only a fully valid recipe replaces what an earlier setup() prepared.
  coco_ = std::move(coco);
  train_samples_ = recipe.getInt("train.steps") * recipe.getInt("train.global_batch_size");
  data_ = data;
  config_ = c;
  eval_size_ = recipe.getInt("data.eval_size");
  max_detections_ = recipe.getInt("model.max_detections");
  ready_ = true;
}

double DetectionTrainer::trainFlops(double images) const {
  if (!ready_) return 0;
  // Forward 2 FLOPs a multiply-add, backward twice the forward (Megatron's
  // convention; recomputation not counted).
  return images * 6.0 * static_cast<double>(centerNetMultiplyAdds(config_, data_.canvas));
}

std::shared_ptr<CenterNetModel> DetectionTrainer::makeModel(const ModelBuild& build) {
  PTRAIN_CHECK(ready_, "detection trainer: buildModel() before setup()");
  return std::make_shared<CenterNetModel>(config_, build);
}

Batch DetectionTrainer::globalBatch(int64_t step, int64_t globalBatchSize) {
  return batchRows(step, globalBatchSize, 0, globalBatchSize);
}

Batch DetectionTrainer::batchRows(int64_t step, int64_t globalBatchSize, int64_t begin, int64_t end) {
  PTRAIN_CHECK(ready_, "detection trainer: batchRows() before setup()");
  // Canvas i of step s is canvas s * global + i of the training stream (of
  // the files' training order).
  Batch batch = coco_ ? coco_->trainRows(step * globalBatchSize + begin, end - begin)
                      : datasets::mosaicBatch(data_, MosaicSplit::kTrain, step * globalBatchSize + begin, end - begin);
  addCenterNetTargets(batch, config_.classes, data_.canvas);
  return batch;
}

double DetectionTrainer::lossCount(const Batch& batch) const { return batch.at("object_mask").sum().item<double>(); }

double DetectionTrainer::tokensIn(const Batch& batch) const { return static_cast<double>(batch.size()); }

TrainSummary DetectionTrainer::train(TrainingSession& session) {
  run_dir_ = session.runDir();
  rank_ = session.env().rank;
  return defaultTrainingLoop(session, *this);
}

std::map<std::string, double> DetectionTrainer::evaluateModel(CenterNetModel& net, const EvalContext& ctx) {
  PTRAIN_CHECK(ready_, "detection trainer: evaluate() before setup()");
  PTRAIN_CHECK(ctx.num_shards >= 1 && ctx.shard >= 0 && ctx.shard < ctx.num_shards, "detection trainer: eval shard ",
               ctx.shard, " of ", ctx.num_shards);
  torch::NoGradGuard noGrad;
  if (eval_size_ == 0) return {};

  const int64_t n = coco_ ? std::min(eval_size_, coco_->validationSize()) : eval_size_;
  if (n == 0) return {};
  auto categoryId = [this](int64_t label) {
    return coco_ ? coco_->categoryId(label) : datasets::mosaicCocoCategoryId(label);
  };
  const int64_t begin = n * ctx.shard / ctx.num_shards, end = n * (ctx.shard + 1) / ctx.num_shards;
  const int64_t side = data_.canvas / kOutputStride, outChannels = config_.classes + 4;
  const int64_t topK = std::min(max_detections_, config_.classes * side * side);
  const auto f64 = torch::TensorOptions(torch::kFloat64).device(ctx.device);
  // Every rank's decoded rows land in their canvases' places; one sum gives
  // every rank all of them.
  at::Tensor detections = torch::zeros({n, topK, 6}, f64);
  at::Tensor lossSums = torch::zeros({2}, f64);  // loss sum, objects

  // Ranks of one data-parallel group may hold shards of different sizes but
  // a pipeline or tensor-parallel group runs the same shard, so the chunks
  // need no extra synchronisation.
  for (int64_t first = begin; first < end; first += kEvalChunk) {
    const int64_t count = std::min(kEvalChunk, end - first);
    Batch batch = coco_ ? coco_->validationRows(first, count)
                        : datasets::mosaicBatch(data_, MosaicSplit::kValidation, first, count);
    addCenterNetTargets(batch, config_.classes, data_.canvas);
    batch = batch.to(ctx.device);
    at::Tensor hidden = net.forwardHidden(batch);
    at::Tensor outputs, loss = torch::zeros({2}, f64);
    if (net.holdsHead()) {
      outputs = net.headOutputs(hidden).to(torch::kFloat32);
      LossOutput l = net.head(hidden, batch);
      loss = torch::tensor({l.loss_sum.item<double>(), l.count}, f64);
    } else {
      outputs = torch::zeros({count, outChannels, side, side}, torch::TensorOptions(torch::kFloat32).device(ctx.device));
    }
    net.shareFromHead(outputs);
    net.shareFromHead(loss);
    lossSums += loss;
    detections.narrow(0, first, count).copy_(decodeCenterNet(outputs, config_.classes, topK));
  }
  if (ctx.all_reduce_sum) {
    ctx.all_reduce_sum(detections);
    ctx.all_reduce_sum(lossSums);
  }
  detections = detections.cpu();
  lossSums = lossSums.cpu();

  std::vector<Detection> found;
  auto d = detections.accessor<double, 3>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < topK; ++j) {
      // Cells that are not peaks have score 0: not detections.
      if (d[i][j][1] <= 0) continue;
      Detection det;
      det.image_id = i;
      det.category_id = categoryId(static_cast<int64_t>(d[i][j][0]));
      det.score = d[i][j][1];
      det.bbox = Box{d[i][j][2], d[i][j][3], d[i][j][4], d[i][j][5]};
      found.push_back(det);
    }
  }
  if (ground_truth_.empty() && coco_) {
    ground_truth_ = coco_->validationTruth(n);
  } else if (ground_truth_.empty()) {
    for (int64_t i = 0; i < n; ++i) {
      for (const datasets::MosaicBox& b : datasets::mosaicSample(data_, MosaicSplit::kValidation, i).boxes) {
        GroundTruth gt;
        gt.image_id = i;
        gt.category_id = datasets::mosaicCocoCategoryId(b.label);
        gt.bbox = Box{static_cast<double>(b.x), static_cast<double>(b.y), static_cast<double>(b.width),
                      static_cast<double>(b.height)};
        gt.area = static_cast<double>(b.area);
        ground_truth_.push_back(gt);
      }
    }
  }
  const CocoMetrics metrics = evaluateCoco(ground_truth_, found);

  if (rank_ == 0 && !run_dir_.empty()) {
    writeCocoDetections(run_dir_ + "/detections.json", found);
    if (!wrote_ground_truth_) {
      if (coco_) {
        // In canvas pixels (letterboxed), as the detections are.
        std::vector<int64_t> ids(static_cast<size_t>(n));
        std::iota(ids.begin(), ids.end(), int64_t{0});
        writeCocoGroundTruth(run_dir_ + "/coco_gt.json", ground_truth_, ids);
      } else {
        datasets::writeCocoGroundTruth(run_dir_ + "/coco_gt.json", data_, n);
      }
      wrote_ground_truth_ = true;
    }
    // The first canvases with their true boxes and detections, for a look
    // (the generator's canvases only).
    if (!coco_) {
      const int64_t shown = std::min<int64_t>(n, kPictureCanvases);
      writePng(run_dir_ + "/predictions.png",
               predictionPicture(data_, shown, kPictureColumns, 2, ground_truth_, found, kPictureMinScore));
    }
  }

  std::map<std::string, double> out;
  out["eval_map"] = std::max(0.0, metrics.ap);
  out["eval_map50"] = std::max(0.0, metrics.ap50);
  out["eval_map75"] = std::max(0.0, metrics.ap75);
  out["eval_ar100"] = std::max(0.0, metrics.ar100);
  if (lossSums[1].item<double>() > 0) out["eval_loss"] = lossSums[0].item<double>() / lossSums[1].item<double>();
  return out;
}

void DetectionTrainer::exportData(const std::string& name, const std::string& out, int64_t train,
                                  int64_t validation) const {
  PTRAIN_CHECK(ready_, "detection trainer: exportData() before setup()");
  if (name != "mosaic") {
    throw ConfigError("data export: '" + name + "' is not a data set of the detection trainer; use mosaic");
  }
  if (coco_) {
    throw ConfigError("data export mosaic: the recipe reads files (data.name: coco); give the recipe that trains on "
                      "the mosaics (data.name: mosaic), whose canvas options and train.seed the export uses");
  }
  std::error_code ec;
  if (std::filesystem::exists(out, ec) &&
      (!std::filesystem::is_directory(out, ec) || !std::filesystem::is_empty(out, ec))) {
    throw ConfigError("data export mosaic: " + out + " exists and is not an empty folder; remove it or choose "
                      "another");
  }
  const int64_t trainCount = train > 0 ? train : train_samples_;
  const int64_t validationCount = validation > 0 ? validation : eval_size_;
  std::vector<datasets::CocoCategory> categories;
  for (int64_t label = 0; label < datasets::kFashionMnistClasses; ++label) {
    categories.push_back({datasets::mosaicCocoCategoryId(label), datasets::kFashionMnistClassNames[label]});
  }
  int64_t boxes = 0;
  for (const MosaicSplit split : {MosaicSplit::kTrain, MosaicSplit::kValidation}) {
    const bool isTrain = split == MosaicSplit::kTrain;
    datasets::CocoWriter writer(out, datasets::mosaicSplitName(split), categories);
    const int64_t count = isTrain ? trainCount : validationCount;
    for (int64_t i = 0; i < count; ++i) {
      datasets::MosaicCanvas canvas = datasets::mosaicCanvas(data_, split, i);
      datasets::Image image;
      image.width = image.height = canvas.side;
      image.channels = 1;
      image.bytes = std::move(canvas.pixels);
      std::vector<datasets::CocoBox> cocoBoxes;
      for (const datasets::MosaicBox& b : canvas.boxes) {
        datasets::CocoBox box;
        box.x = static_cast<double>(b.x);
        box.y = static_cast<double>(b.y);
        box.width = static_cast<double>(b.width);
        box.height = static_cast<double>(b.height);
        box.label = b.label;
        box.area = static_cast<double>(b.area);
        cocoBoxes.push_back(box);
      }
      boxes += static_cast<int64_t>(cocoBoxes.size());
      char file[64];
      std::snprintf(file, sizeof file, "mosaic_%s_%06lld.png", datasets::mosaicSplitName(split),
                    static_cast<long long>(i));
      writer.add(i, file, image, cocoBoxes);
    }
    writer.finish();
  }
  std::cout << "mosaic: wrote " << trainCount << " training and " << validationCount << " validation canvases ("
            << boxes << " boxes, " << data_.canvas << "x" << data_.canvas << ", train.seed " << data_.seed
            << ") to " << out << std::endl;
}

nlohmann::json DetectionTrainer::dataPosition(int64_t step, int64_t globalBatchSize) const {
  if (!coco_) return nullptr;
  return coco_->position(step * globalBatchSize);
}

std::optional<std::string> DetectionTrainer::checkDataPosition(const nlohmann::json& saved, int64_t,
                                                               int64_t) const {
  if (!coco_) {
    if (!saved.is_null()) {
      return std::string("the checkpoint's run read files (data.name: coco), this one the built-in mosaics");
    }
    return std::nullopt;
  }
  return coco_->differs(saved);
}

}  // namespace ptrain::detection

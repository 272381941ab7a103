// CenterNet (Zhou et al., "Objects as Points") at output stride 4 as a
// StagedModel: every object is the peak of a per-class heatmap at its box
// centre, with its size and the sub-cell offset of the centre regressed at
// that cell.
//
//   embed:  stem.conv1 3x3 stride 2 (1 -> stem_channels) -> BN -> ReLU
//           stem.conv2 3x3 stride 2 (stem_channels -> channels) -> BN -> ReLU
//           (a 128 canvas becomes 32x32; the downsampling is all here so that
//           every block keeps the shape, which a pipeline needs)
//   block:  x = ReLU(x + up(ReLU(bn(expand(x)))))
//           expand: ColumnParallelConv2d 3x3 (channels -> inner_channels)
//           bn:     ChannelParallelBatchNorm2d (inner_channels)
//           up:     RowParallelConv2d 1x1 (inner_channels -> channels)
//   head:   features 3x3 (channels -> channels) -> ReLU -> out 1x1 (channels ->
//           classes + 4): heatmap logits (classes), size (w, h in output
//           cells), offset (x, y of the centre within its cell)
//
// Parameter names: embed.stem.{conv1,conv2}.{weight,bias},
// embed.stem.{bn1,bn2}.{weight,bias}, blocks.<i>.{expand,bn,up}.{weight,bias},
// head.{features,out}.{weight,bias}.
//
// Loss (head): CenterNet's penalty-reduced focal loss (alpha 2, beta 4) on
// the Gaussian-splatted heatmap, plus L1 on size (weight size_weight) and
// offset (weight offset_weight) at each object's centre cell; its sum, with
// count = the number of objects (the engine divides by the count of the whole
// global batch, as CenterNet normalises by the number of objects).
//
// Initialisation: each parameter from a generator of its own, seeded by a base
// seed (one draw of torch's default generator) and its name, so equal seeds
// give equal weights and a pipeline stage builds the values the whole model
// has. Conv weights ~ N(0, sqrt(2 / fan_in)) (He), biases 0, norms 1 / 0; the
// output conv's weights ~ N(0, 0.01) and its heatmap biases -2.19 (CenterNet's
// prior of 0.1 for every cell, so the focal loss does not start swamped by
// the background).
//
// Thread-safety: one thread at a time (torch modules are not thread-safe).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>

#include "coco_eval.h"
#include "ptrain/engine/batch.h"
#include "ptrain/engine/model.h"
#include "ptrain/nn/parallel_conv.h"

namespace ptrain::detection {

inline constexpr int64_t kOutputStride = 4;

struct CenterNetConfig {
  int64_t classes = 10;
  int64_t stem_channels = 16;
  int64_t channels = 32;        // width of the blocks and the head
  int64_t inner_channels = 64;  // width inside a block (the tensor-parallel split)
  int64_t num_blocks = 2;
  double size_weight = 0.1;
  double offset_weight = 1.0;
};

// The training targets of a batch of canvases, in the batch itself so that
// micro-batches and data-parallel shards cut them with the images:
//   "heatmap"       [N, classes, H/4, W/4] float32: per class, the maximum of
//                   one Gaussian per object at its centre cell (peak exactly 1)
//   "center_index"  [N, K] int64: the centre cell (y * W/4 + x), 0 past box_counts
//   "size_target"   [N, K, 2] float32: box width and height in output cells
//   "offset_target" [N, K, 2] float32: centre minus its cell, in [0, 1)
//   "object_mask"   [N, K] float32: 1 for the objects, 0 for padding
// from "boxes" [N, K, 4] xywh, "labels" [N, K], "box_counts" [N] (mosaicBatch).
void addCenterNetTargets(Batch& batch, int64_t classes, int64_t canvas);

// CenterNet's Gaussian radius for a box of this size in output cells (its
// gaussian_radius with min_overlap 0.7), at least 0.
double gaussianRadius(double height, double width, double minOverlap = 0.7);

class CenterNetBlockImpl : public torch::nn::Module {
 public:
  explicit CenterNetBlockImpl(const CenterNetConfig& config);
  at::Tensor forward(const at::Tensor& x);

  nn::ColumnParallelConv2d expand{nullptr};
  nn::ChannelParallelBatchNorm2d bn{nullptr};
  nn::RowParallelConv2d up{nullptr};
};
TORCH_MODULE(CenterNetBlock);

class CenterNetStemImpl : public torch::nn::Module {
 public:
  explicit CenterNetStemImpl(const CenterNetConfig& config);
  at::Tensor forward(const at::Tensor& images);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(CenterNetStem);

class CenterNetHeadImpl : public torch::nn::Module {
 public:
  explicit CenterNetHeadImpl(const CenterNetConfig& config);
  // [N, channels, h, w] -> [N, classes + 4, h, w] raw outputs.
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Conv2d features{nullptr}, out{nullptr};
};
TORCH_MODULE(CenterNetHead);

class CenterNetModuleImpl : public torch::nn::Module {
 public:
  CenterNetModuleImpl(const CenterNetConfig& config, const ModelBuild& build);

  std::shared_ptr<torch::nn::Module> embed;   // child "stem", when built
  CenterNetStem stem{nullptr};
  std::shared_ptr<torch::nn::Module> blocks;  // children "0", "1", ...: the built blocks
  std::map<int, CenterNetBlock> built;
  CenterNetHead head{nullptr};
};
TORCH_MODULE(CenterNetModule);

// A decoded detection on one canvas, in canvas pixels (COCO xywh).
struct DecodedBox {
  int64_t label = 0;  // 0-based class
  double score = 0;
  Box box;
};

// Peaks of the heatmaps (a 3x3 max-pool keeps only local maxima), the `topK`
// highest over every class, with their boxes: centre = (cell + offset) * 4,
// size = size output * 4. `outputs` [N, classes + 4, h, w] raw head outputs ->
// [N, topK, 6] float32 rows (label, score, x, y, width, height).
at::Tensor decodeCenterNet(const at::Tensor& outputs, int64_t classes, int64_t topK);

class CenterNetModel : public StagedModel {
 public:
  explicit CenterNetModel(const CenterNetConfig& config, const ModelBuild& build = {});
  ~CenterNetModel() override;

  torch::nn::Module& module() override;
  int numBlocks() const override;
  int64_t blockCost(int index) override;
  std::string blockPrefix(int index) const override;
  std::vector<std::string> embedPrefixes() const override;
  std::vector<std::string> headPrefixes() const override;

  // micro["images"] [N, 1, H, W] -> [N, channels, H/4, W/4].
  at::Tensor embed(const Batch& micro) override;
  at::Tensor runBlock(int index, const at::Tensor& hidden) override;
  // The focal + L1 losses against the targets of addCenterNetTargets.
  LossOutput head(const at::Tensor& hidden, const Batch& micro) override;
  // Raw head outputs [N, classes + 4, h, w] of the last blocks' output.
  at::Tensor headOutputs(const at::Tensor& hidden);

  // expand, bn and up of every built block.
  TensorParallelPlan tensorParallelPlan() override;
  void setTensorParallel(std::shared_ptr<const nn::TensorParallelState> state) override;

  const CenterNetConfig& config() const { return config_; }

 private:
  void initialise(uint64_t baseSeed);

  CenterNetConfig config_;
  CenterNetModule root_{nullptr};
  std::shared_ptr<const nn::TensorParallelState> tp_;
};

}  // namespace ptrain::detection

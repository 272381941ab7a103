// CenterNet (Zhou et al., "Objects as Points") at output stride 4 as a
// StagedModel: every object is the peak of a per-class heatmap at its box
// centre, with its size and the sub-cell offset of the centre regressed at
// that cell.
//
//   embed:  stem.conv1 3x3 stride 2 (1 -> stem_channels) -> GroupNorm -> ReLU
//           stem.conv2 3x3 stride 2 (stem_channels -> channels) -> GroupNorm -> ReLU
//           (a 128 canvas becomes 32x32; the downsampling is all here so that
//           every block keeps the shape, which a pipeline needs)
//   block:  x = ReLU(x + up(ReLU(norm(expand(x)))))
//           expand: ColumnParallelConv2d 3x3 (channels -> inner_channels)
//           norm:   ChannelParallelGroupNorm (inner_channels, 4 per group)
//           up:     RowParallelConv2d 1x1 (inner_channels -> channels)
//   head:   features 3x3 (channels -> channels) -> ReLU -> out 1x1 (channels ->
//           classes + 4): heatmap logits (classes), size (w, h in output
//           cells), offset (x, y of the centre within its cell)
//
// Parameter names: embed.stem.{conv1,conv2}.{weight,bias},
// embed.stem.{norm1,norm2}.{weight,bias}, blocks.<i>.{expand,norm,up}.{weight,bias},
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
// With class_weight > 0 the head adds class_weight x a softmax cross-entropy
// of the heatmap logits at each object's centre cell against its label.
//
// Thread-safety: one thread at a time (torch modules are not thread-safe).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/conv.h>

#include "coco_eval.h"
#include "ptrain/engine/batch.h"
#include "ptrain/engine/model.h"
#include "ptrain/nn/parallel_conv.h"

namespace ptrain::detection {

inline constexpr int64_t kOutputStride = 4;
// Group norm's groups hold 4 channels (or the nearest divisor of the
// channels giving at least 4): per-sample statistics, so a data-parallel
// split normalises exactly as one rank does, and no running statistics to
// keep in checkpoints.
inline constexpr int64_t kChannelsPerGroup = 4;
int64_t normGroups(int64_t channels);

struct CenterNetConfig {
  int64_t classes = 10;
  int64_t stem_channels = 16;
  int64_t channels = 32;        // width of the blocks and the head
  int64_t inner_channels = 64;  // width inside a block (the tensor-parallel split)
  // Where the blocks run: 4 (the output stride) or 8, where a third stride-2
  // stem convolution (2 * stem_channels -> channels) halves the side and the
  // head upsamples (nearest) back to stride 4 before its features. At 8 the
  // blocks afford twice the channels for the same cost and see twice as far.
  int64_t block_stride = 4;
  int64_t head_channels = 32;   // the head's 3x3 features (at stride 4)
  int64_t num_blocks = 2;
  // Dilation of block i's 3x3 convolution: dilations[i % size]. Dilated
  // blocks widen the receptive field at the same cost and shape (so every
  // block still fits a pipeline stage): 1, 2, 4 make it 71 pixels after
  // three blocks instead of 39, enough to see a 2x-scaled 56-pixel item.
  std::vector<int64_t> dilations{1};
  double size_weight = 0.1;
  double offset_weight = 1.0;
  // Weight of a softmax cross-entropy over the class logits at each object's
  // centre cell (0: CenterNet's losses only). The focal loss trains each
  // class's heatmap on its own; this term makes the classes compete where an
  // object is, which is where confusable classes (shirt, T-shirt, pullover,
  // coat) are told apart.
  double class_weight = 0.0;
};

// Multiply-adds of one forward pass over one `canvas` x `canvas` image: every
// convolution's output elements x its input channels x kernel area, at the
// sides the strides give (canvas / 2, / 4, / 8). Group norms, ReLUs, the
// residual additions and the upsampling are not counted (elementwise work,
// which model FLOPs leave out as Megatron's do). At block_stride 8 the head's
// 3x3 features over the nearest-upsampled map count as the four 2x2
// convolutions they are computed as (upsampleTwiceThenConv3x3): 4 taps per
// output pixel and input channel, not 9, since the other 5 would multiply
// copies of the same pixels. DetectionTrainer::trainFlops is 6 x this per
// image (2 FLOPs a multiply-add, backward twice forward).
int64_t centerNetMultiplyAdds(const CenterNetConfig& config, int64_t canvas);

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
  CenterNetBlockImpl(const CenterNetConfig& config, int64_t dilation);
  at::Tensor forward(const at::Tensor& x);

  nn::ColumnParallelConv2d expand{nullptr};
  nn::ChannelParallelGroupNorm norm{nullptr};
  nn::RowParallelConv2d up{nullptr};
};
TORCH_MODULE(CenterNetBlock);

class CenterNetStemImpl : public torch::nn::Module {
 public:
  explicit CenterNetStemImpl(const CenterNetConfig& config);
  at::Tensor forward(const at::Tensor& images);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};  // conv3: block_stride 8 only
  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
};
TORCH_MODULE(CenterNetStem);

// conv2d(upsample_nearest2d(x, 2x), weight, bias, padding 1) for a 3x3
// `weight` [out, in, 3, 3], computed as four 2x2 convolutions over x (one per
// output phase) and interleaved: the same values up to rounding for 44% of the
// multiply-adds. The head's path at block stride 8 (its costliest layer).
at::Tensor upsampleTwiceThenConv3x3(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

class CenterNetHeadImpl : public torch::nn::Module {
 public:
  explicit CenterNetHeadImpl(const CenterNetConfig& config);
  // [N, channels, h, w] at the block stride -> [N, classes + 4, H/4, W/4]
  // raw outputs.
  at::Tensor forward(const at::Tensor& x);

  int64_t upsample = 1;  // block_stride / 4
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

  // expand, norm and up of every built block.
  TensorParallelPlan tensorParallelPlan() override;
  void setTensorParallel(std::shared_ptr<const nn::TensorParallelState> state) override;

  // Norm scales 1, biases 0 (the class heatmaps' -2.19, a prior of 0.1),
  // head.out's weight N(0, 0.01) and every other weight N(0, sqrt(2 /
  // fan_in)) of its whole shape, from the parameter's own stream.
  std::optional<nn::ParameterInit> parameterInit(const std::string& name,
                                                 const std::vector<int64_t>& fullSizes) const override;

  const CenterNetConfig& config() const { return config_; }

 private:
  CenterNetConfig config_;
  uint64_t base_seed_ = 0;
  CenterNetModule root_{nullptr};
  std::shared_ptr<const nn::TensorParallelState> tp_;
};

}  // namespace ptrain::detection

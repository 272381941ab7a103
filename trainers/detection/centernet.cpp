#include "centernet.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
#include "ptrain/nn/parameter_seed.h"
#include "ptrain/nn/tp_comm.h"

namespace ptrain::detection {

namespace {

torch::nn::Conv2dOptions convOptions(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2);
}

nn::ParallelConv2dOptions parallelConv(int64_t in, int64_t out, int64_t kernel, int64_t dilation = 1) {
  nn::ParallelConv2dOptions o(in, out, kernel);
  o.dilation = {dilation, dilation};
  o.padding = {dilation * (kernel / 2), dilation * (kernel / 2)};
  return o;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

int64_t normGroups(int64_t channels) {
  int64_t groups = std::max<int64_t>(1, channels / kChannelsPerGroup);
  while (channels % groups != 0) --groups;
  return groups;
}

double gaussianRadius(double height, double width, double minOverlap) {
  // CenterNet's gaussian_radius, including its halving of the quadratics'
  // roots (not divided by 2a), so the heatmaps are the ones it trains on.
  const double a1 = 1, b1 = height + width, c1 = width * height * (1 - minOverlap) / (1 + minOverlap);
  const double r1 = (b1 + std::sqrt(std::max(0.0, b1 * b1 - 4 * a1 * c1))) / 2;
  const double a2 = 4, b2 = 2 * (height + width), c2 = (1 - minOverlap) * width * height;
  const double r2 = (b2 + std::sqrt(std::max(0.0, b2 * b2 - 4 * a2 * c2))) / 2;
  const double a3 = 4 * minOverlap, b3 = -2 * minOverlap * (height + width), c3 = (minOverlap - 1) * width * height;
  const double r3 = (b3 + std::sqrt(std::max(0.0, b3 * b3 - 4 * a3 * c3))) / 2;
  return std::max(0.0, std::min({r1, r2, r3}));
}

int64_t centerNetMultiplyAdds(const CenterNetConfig& c, int64_t canvas) {
  // A 3x3 convolution with padding 1 at stride 2 halves an even side exactly,
  // and the recipe's canvas is a multiple of the block stride.
  const int64_t half = canvas / 2, quarter = canvas / 4, blockSide = canvas / c.block_stride;
  auto conv = [](int64_t side, int64_t in, int64_t out, int64_t taps) { return side * side * out * in * taps; };
  const int64_t second = c.block_stride == 8 ? 2 * c.stem_channels : c.channels;
  int64_t macs = conv(half, 1, c.stem_channels, 9) + conv(quarter, c.stem_channels, second, 9);
  if (c.block_stride == 8) macs += conv(blockSide, second, c.channels, 9);
  // Dilation changes where a block's taps read, not how many there are.
  macs += c.num_blocks *
          (conv(blockSide, c.channels, c.inner_channels, 9) + conv(blockSide, c.inner_channels, c.channels, 1));
  const int64_t featureTaps = c.block_stride == 8 ? 4 : 9;
  macs += conv(quarter, c.channels, c.head_channels, featureTaps) + conv(quarter, c.head_channels, c.classes + 4, 1);
  return macs;
}

void addCenterNetTargets(Batch& batch, int64_t classes, int64_t canvas) {
  const at::Tensor boxes = batch.at("boxes").to(torch::kFloat32).contiguous();
  const at::Tensor labels = batch.at("labels").to(torch::kInt64).contiguous();
  const at::Tensor counts = batch.at("box_counts").to(torch::kInt64).contiguous();
  const int64_t n = boxes.size(0), k = boxes.size(1);
  const int64_t side = canvas / kOutputStride;

  at::Tensor heatmap = torch::zeros({n, classes, side, side});
  at::Tensor centers = torch::zeros({n, k}, torch::kInt64);
  at::Tensor sizes = torch::zeros({n, k, 2});
  at::Tensor offsets = torch::zeros({n, k, 2});
  at::Tensor mask = torch::zeros({n, k});
  auto hm = heatmap.accessor<float, 4>();
  auto ctr = centers.accessor<int64_t, 2>();
  auto sz = sizes.accessor<float, 3>();
  auto off = offsets.accessor<float, 3>();
  auto msk = mask.accessor<float, 2>();
  auto bx = boxes.accessor<float, 3>();
  auto lb = labels.accessor<int64_t, 2>();
  auto ct = counts.accessor<int64_t, 1>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < std::min(ct[i], k); ++j) {
      const int64_t label = lb[i][j];
      PTRAIN_CHECK(label >= 0 && label < classes, "centernet: label ", label, " outside [0, ", classes, ")");
      const double w = bx[i][j][2] / kOutputStride, h = bx[i][j][3] / kOutputStride;
      const double cx = (bx[i][j][0] + bx[i][j][2] / 2.0) / kOutputStride;
      const double cy = (bx[i][j][1] + bx[i][j][3] / 2.0) / kOutputStride;
      const int64_t x = std::clamp<int64_t>(static_cast<int64_t>(std::floor(cx)), 0, side - 1);
      const int64_t y = std::clamp<int64_t>(static_cast<int64_t>(std::floor(cy)), 0, side - 1);
      ctr[i][j] = y * side + x;
      sz[i][j][0] = static_cast<float>(w);
      sz[i][j][1] = static_cast<float>(h);
      off[i][j][0] = static_cast<float>(cx - x);
      off[i][j][1] = static_cast<float>(cy - y);
      msk[i][j] = 1;
      // draw_umich_gaussian: a (2r+1)^2 Gaussian with sigma = (2r+1)/6.
      const int64_t r = static_cast<int64_t>(gaussianRadius(h, w));
      const double sigma = (2.0 * static_cast<double>(r) + 1) / 6.0;
      for (int64_t dy = -r; dy <= r; ++dy) {
        for (int64_t dx = -r; dx <= r; ++dx) {
          const int64_t yy = y + dy, xx = x + dx;
          if (yy < 0 || yy >= side || xx < 0 || xx >= side) continue;
          const float g = static_cast<float>(std::exp(-static_cast<double>(dx * dx + dy * dy) / (2 * sigma * sigma)));
          hm[i][label][yy][xx] = std::max(hm[i][label][yy][xx], g);
        }
      }
    }
  }
  batch.tensors["heatmap"] = heatmap;
  batch.tensors["center_index"] = centers;
  batch.tensors["size_target"] = sizes;
  batch.tensors["offset_target"] = offsets;
  batch.tensors["object_mask"] = mask;
}

// ---- modules ----

CenterNetStemImpl::CenterNetStemImpl(const CenterNetConfig& c) {
  conv1 = register_module("conv1", torch::nn::Conv2d(convOptions(1, c.stem_channels, 3, 2)));
  norm1 = register_module("norm1", torch::nn::GroupNorm(normGroups(c.stem_channels), c.stem_channels));
  const int64_t second = c.block_stride == 8 ? 2 * c.stem_channels : c.channels;
  conv2 = register_module("conv2", torch::nn::Conv2d(convOptions(c.stem_channels, second, 3, 2)));
  norm2 = register_module("norm2", torch::nn::GroupNorm(normGroups(second), second));
  if (c.block_stride == 8) {
    conv3 = register_module("conv3", torch::nn::Conv2d(convOptions(second, c.channels, 3, 2)));
    norm3 = register_module("norm3", torch::nn::GroupNorm(normGroups(c.channels), c.channels));
  }
}

at::Tensor CenterNetStemImpl::forward(const at::Tensor& images) {
  at::Tensor x = torch::relu(norm1(conv1(images)));
  x = torch::relu(norm2(conv2(x)));
  return conv3 ? torch::relu(norm3(conv3(x))) : x;
}

CenterNetBlockImpl::CenterNetBlockImpl(const CenterNetConfig& c, int64_t dilation) {
  expand = register_module("expand",
                           nn::ColumnParallelConv2d(parallelConv(c.channels, c.inner_channels, 3, dilation)));
  norm = register_module("norm",
                         nn::ChannelParallelGroupNorm(normGroups(c.inner_channels), c.inner_channels));
  up = register_module("up", nn::RowParallelConv2d(parallelConv(c.inner_channels, c.channels, 1)));
}

at::Tensor CenterNetBlockImpl::forward(const at::Tensor& x) {
  return torch::relu(x + up(torch::relu(norm(expand(x)))));
}

CenterNetHeadImpl::CenterNetHeadImpl(const CenterNetConfig& c) {
  upsample = c.block_stride / kOutputStride;
  features = register_module("features", torch::nn::Conv2d(convOptions(c.channels, c.head_channels, 3, 1)));
  out = register_module("out", torch::nn::Conv2d(convOptions(c.head_channels, c.classes + 4, 1, 1)));
}

at::Tensor upsampleTwiceThenConv3x3(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  // Output pixel (2i + a, 2j + b) of the 3x3 convolution (padding 1) over the
  // nearest-upsampled map reads low-resolution rows i - 1, i when a = 0 (with
  // kernel rows 0 and 1 + 2) and rows i, i + 1 when a = 1 (kernel rows 0 + 1
  // and 2), and the same for columns: four 2x2 convolutions over the
  // low-resolution map, 16 multiply-adds per input channel for each 2x2 block
  // of outputs instead of 36.
  const auto options = weight.options();
  const at::Tensor taps[2] = {torch::tensor({1.0, 0.0, 0.0, 0.0, 1.0, 1.0}, options).reshape({2, 3}),
                              torch::tensor({1.0, 1.0, 0.0, 0.0, 0.0, 1.0}, options).reshape({2, 3})};
  const int64_t n = x.size(0), h = x.size(2), w = x.size(3);
  // One pixel of zero padding at low resolution is the upsampled map's padding;
  // phase (a, b) reads the (h + 1) x (w + 1) window starting at row a, column b.
  const at::Tensor padded = torch::constant_pad_nd(x, {1, 1, 1, 1}, 0);
  std::vector<at::Tensor> phases;
  for (int a = 0; a < 2; ++a) {
    for (int b = 0; b < 2; ++b) {
      const at::Tensor kernel = torch::einsum("ry,ocyx,sx->ocrs", {taps[a], weight, taps[b]});
      phases.push_back(torch::conv2d(padded.narrow(2, a, h + 1).narrow(3, b, w + 1), kernel, bias));
    }
  }
  // [n, o, a, b, h, w] -> [n, o, h, a, w, b] = [n, o, 2h, 2w].
  return torch::stack(phases, 2)
      .view({n, weight.size(0), 2, 2, h, w})
      .permute({0, 1, 4, 2, 5, 3})
      .reshape({n, weight.size(0), 2 * h, 2 * w});
}

at::Tensor CenterNetHeadImpl::forward(const at::Tensor& x) {
  if (upsample == 2) return out(torch::relu(upsampleTwiceThenConv3x3(x, features->weight, features->bias)));
  at::Tensor in = x;
  if (upsample > 1) {
    in = torch::upsample_nearest2d(x, {x.size(2) * upsample, x.size(3) * upsample});
  }
  return out(torch::relu(features(in)));
}

CenterNetModuleImpl::CenterNetModuleImpl(const CenterNetConfig& c, const ModelBuild& build) {
  // Registration order is the parameter order: embed, blocks, head.
  embed = register_module("embed", std::make_shared<torch::nn::Module>());
  if (build.embed) stem = embed->register_module("stem", CenterNetStem(c));
  blocks = register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int i = 0; i < static_cast<int>(c.num_blocks); ++i) {
    const int64_t dilation = c.dilations.at(static_cast<size_t>(i) % c.dilations.size());
    if (build.buildsBlock(i)) {
      built.emplace(i, blocks->register_module(std::to_string(i), CenterNetBlock(c, dilation)));
    }
  }
  if (build.head) head = register_module("head", CenterNetHead(c));
}

// ---- model ----

CenterNetModel::CenterNetModel(const CenterNetConfig& config, const ModelBuild& build) : config_(config) {
  const CenterNetConfig& c = config_;
  PTRAIN_CHECK_AS(ConfigError, c.num_blocks >= 1, "model.num_layers: ", c.num_blocks, " must be >= 1");
  PTRAIN_CHECK_AS(ConfigError, c.channels >= 1 && c.inner_channels >= 1 && c.stem_channels >= 1,
                  "centernet: channel counts must be >= 1");
  PTRAIN_CHECK_AS(ConfigError, c.block_stride == 4 || c.block_stride == 8, "model.block_stride: ", c.block_stride,
                  " must be 4 or 8");
  PTRAIN_CHECK_AS(ConfigError, !c.dilations.empty(), "model.block_dilations: give at least one dilation, e.g. [1]");
  for (int64_t d : c.dilations) {
    PTRAIN_CHECK_AS(ConfigError, d >= 1, "model.block_dilations: ", d, " must be >= 1 (1: no dilation)");
  }
  base_seed_ = nn::modelSeed();
  root_ = CenterNetModule(c, build);
  initialiseParameters();
}

CenterNetModel::~CenterNetModel() = default;

std::optional<nn::ParameterInit> CenterNetModel::parameterInit(const std::string& name,
                                                              const std::vector<int64_t>& fullSizes) const {
  if (name == "head.out.bias") {
    const int64_t classes = config_.classes;
    return nn::ParameterInit::custom([classes](at::Tensor& shard, const std::vector<int64_t>& offsets) {
      shard.zero_();
      const int64_t begin = offsets[0], end = offsets[0] + shard.size(0);
      if (begin < classes) shard.narrow(0, 0, std::min(end, classes) - begin).fill_(-2.19);
    });
  }
  if (text::endsWith(name, ".bias")) return nn::ParameterInit::constant(0.0);
  if (contains(name, ".norm")) return nn::ParameterInit::constant(1.0);
  int64_t numel = 1;
  for (int64_t s : fullSizes) numel *= s;
  const double fanIn = static_cast<double>(numel / fullSizes[0]);
  const double std = name == "head.out.weight" ? 0.01 : std::sqrt(2.0 / fanIn);
  return nn::ParameterInit::normal(parameterSeed(base_seed_, name), 0.0, std);
}

torch::nn::Module& CenterNetModel::module() { return *root_; }

int CenterNetModel::numBlocks() const { return static_cast<int>(config_.num_blocks); }

int64_t CenterNetModel::blockCost(int) {
  const int64_t c = config_.channels, i = config_.inner_channels;
  return (c * i * 9 + i) + 2 * i + (i * c + c);
}

std::string CenterNetModel::blockPrefix(int index) const { return "blocks." + std::to_string(index) + "."; }
std::vector<std::string> CenterNetModel::embedPrefixes() const { return {"embed."}; }
std::vector<std::string> CenterNetModel::headPrefixes() const { return {"head."}; }

at::Tensor CenterNetModel::embed(const Batch& micro) {
  PTRAIN_CHECK(root_->stem, "centernet: embed() on a rank that did not build the stem");
  const at::Tensor& images = micro.at("images");
  PTRAIN_CHECK(images.dim() == 4 && images.size(1) == 1, "centernet: images must be [N, 1, H, W], got ",
               images.sizes());
  return root_->stem(images);
}

at::Tensor CenterNetModel::runBlock(int index, const at::Tensor& hidden) {
  auto it = root_->built.find(index);
  PTRAIN_CHECK(it != root_->built.end(), "centernet: block ", index, " is not built on this rank");
  return it->second->forward(hidden);
}

at::Tensor CenterNetModel::headOutputs(const at::Tensor& hidden) {
  PTRAIN_CHECK(root_->head, "centernet: head on a rank that did not build it");
  return root_->head(hidden);
}

LossOutput CenterNetModel::head(const at::Tensor& hidden, const Batch& micro) {
  // The losses in float32 whatever the compute dtype: the focal loss's logs
  // of probabilities near 0 and 1 are where half precision fails.
  at::Tensor out = headOutputs(hidden).to(torch::kFloat32);
  const int64_t classes = config_.classes;
  at::Tensor logits = out.narrow(1, 0, classes);
  const at::Tensor gt = micro.at("heatmap").to(out.device(), torch::kFloat32);
  // Penalty-reduced focal loss; log(p) and log(1 - p) as log-sigmoids, with
  // p clamped as CenterNet clamps it so a confident mistake stays bounded.
  at::Tensor p = torch::sigmoid(logits).clamp(1e-4, 1 - 1e-4);
  at::Tensor logP = torch::log(p), log1mP = torch::log(1 - p);
  at::Tensor positive = gt.eq(1).to(torch::kFloat32);
  at::Tensor negative = 1 - positive;
  at::Tensor focal = -(logP * (1 - p).pow(2) * positive + log1mP * p.pow(2) * (1 - gt).pow(4) * negative).sum();

  // Size and offset at each object's centre cell.
  const int64_t n = out.size(0), cells = out.size(2) * out.size(3);
  const at::Tensor centers = micro.at("center_index").to(out.device());
  const int64_t k = centers.size(1);
  at::Tensor regression = out.narrow(1, classes, 4).reshape({n, 4, cells});
  at::Tensor picked = regression.gather(2, centers.unsqueeze(1).expand({n, 4, k})).permute({0, 2, 1});  // [n, k, 4]
  at::Tensor mask = micro.at("object_mask").to(out.device(), torch::kFloat32).unsqueeze(2);
  at::Tensor sizeL1 = ((picked.narrow(2, 0, 2) - micro.at("size_target").to(out.device())).abs() * mask).sum();
  at::Tensor offsetL1 = ((picked.narrow(2, 2, 2) - micro.at("offset_target").to(out.device())).abs() * mask).sum();

  LossOutput loss;
  loss.loss_sum = focal + config_.size_weight * sizeL1 + config_.offset_weight * offsetL1;
  if (config_.class_weight > 0) {
    // Class logits at the centre cells [n, k, classes]; padding slots (label
    // -1) take class 0 and are masked out.
    at::Tensor atCentres =
        logits.reshape({n, classes, cells}).gather(2, centers.unsqueeze(1).expand({n, classes, k})).permute({0, 2, 1});
    const at::Tensor labels = micro.at("labels").to(out.device(), torch::kInt64).clamp_min(0).unsqueeze(2);
    at::Tensor picked = torch::log_softmax(atCentres, 2).gather(2, labels);  // [n, k, 1]
    loss.loss_sum = loss.loss_sum - config_.class_weight * (picked * mask).sum();
  }
  loss.count = micro.at("object_mask").sum().item<double>();
  return loss;
}

TensorParallelPlan CenterNetModel::tensorParallelPlan() {
  TensorParallelPlan plan;
  for (auto& [i, block] : root_->built) {
    const std::string prefix = blockPrefix(i);
    plan.layers.emplace_back(prefix + "expand.", block->expand.get());
    plan.layers.emplace_back(prefix + "norm.", block->norm.get());
    plan.layers.emplace_back(prefix + "up.", block->up.get());
  }
  return plan;
}

void CenterNetModel::setTensorParallel(std::shared_ptr<const nn::TensorParallelState> state) { tp_ = std::move(state); }

at::Tensor decodeCenterNet(const at::Tensor& outputs, int64_t classes, int64_t topK) {
  at::Tensor out = outputs.to(torch::kFloat32);
  const int64_t n = out.size(0), h = out.size(2), w = out.size(3), cells = h * w;
  at::Tensor heat = torch::sigmoid(out.narrow(1, 0, classes));
  // A cell is a detection only where it is the maximum of its 3x3
  // neighbourhood in its class: CenterNet's replacement for NMS.
  at::Tensor peaks = torch::max_pool2d(heat, {3, 3}, {1, 1}, {1, 1});
  heat = heat * peaks.eq(heat).to(heat.scalar_type());
  const int64_t k = std::min(topK, classes * cells);
  auto [scores, indices] = heat.reshape({n, classes * cells}).topk(k, 1);
  at::Tensor labels = indices.div(cells, "floor");
  at::Tensor cell = indices.remainder(cells);
  at::Tensor ys = cell.div(w, "floor").to(torch::kFloat32), xs = cell.remainder(w).to(torch::kFloat32);
  at::Tensor regression = out.narrow(1, classes, 4).reshape({n, 4, cells});
  at::Tensor picked = regression.gather(2, cell.unsqueeze(1).expand({n, 4, k}));  // [n, 4, k]
  const double s = static_cast<double>(kOutputStride);
  at::Tensor bw = picked.select(1, 0) * s, bh = picked.select(1, 1) * s;
  at::Tensor cx = (xs + picked.select(1, 2)) * s, cy = (ys + picked.select(1, 3)) * s;
  return torch::stack({labels.to(torch::kFloat32), scores, cx - bw / 2, cy - bh / 2, bw, bh}, 2);
}

}  // namespace ptrain::detection

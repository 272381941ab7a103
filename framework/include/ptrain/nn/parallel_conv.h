// Tensor-parallel convolutions and the channel norms between them
// (docs/tensor_parallel.md, "Convolutions"). The convolutional counterparts of
// ColumnParallelLinear / RowParallelLinear (parallel_layers.h): channels play
// the role of features, and a model declares them in its TensorParallelPlan
// the same way.
//
//   ColumnParallelConv2d      weight [out, in, kh, kw] split along out (dim 0),
//                             bias along out; input replicated, output holds
//                             this rank's output channels (all of them when
//                             gather_output)
//   RowParallelConv2d         weight split along in (dim 1); input holds this
//                             rank's input channels; partial sums all-reduced,
//                             bias added once after the sum
//   ChannelParallelBatchNorm2d   batch norm of a channel-sharded activation:
//                             exact without communication (statistics are per
//                             channel); weight, bias and running statistics
//                             split along the channels
//   ChannelParallelGroupNorm  group norm of a channel-sharded activation: each
//                             rank must hold whole groups (num_groups divisible
//                             by tp), else ConfigError at the first forward
//
// Like the linear layers, every parameter is created full-size from torch's
// default generator (so every layout starts from the same values);
// applyTensorParallel (tensor_parallel.h) keeps the rank's slice and hands the
// layer its TensorParallelState. On one rank they compute exactly torch's
// conv2d / batch_norm / group_norm. Activations are NCHW; channels are dim 1.
//
// Batch-norm statistics are computed over this rank's batch only: under data
// parallelism they are per replica, as torch's BatchNorm2d under DDP (no
// synchronised batch norm).
//
// Thread-safety: one thread at a time (torch modules are not thread-safe).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ptrain/nn/parallel_layers.h"

namespace ptrain::nn {

// The geometry of a 2-d convolution (square or not); groups are always 1.
struct ParallelConv2dOptions {
  ParallelConv2dOptions(int64_t inChannels, int64_t outChannels, int64_t kernel)
      : in_channels(inChannels), out_channels(outChannels), kernel_size{kernel, kernel} {}

  int64_t in_channels;   // full (unsharded) sizes
  int64_t out_channels;
  std::array<int64_t, 2> kernel_size;
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  bool bias = true;
};

class PTRAIN_API ColumnParallelConv2dImpl : public torch::nn::Module, public ParallelLayer {
 public:
  // Weight and bias drawn as torch's Conv2d draws them (uniform in
  // +-1/sqrt(fan_in)), full-size. Throws InternalError for a size < 1.
  explicit ColumnParallelConv2dImpl(const ParallelConv2dOptions& options);
  ~ColumnParallelConv2dImpl() override;
  // input [N, in_channels, H, W] (the same on every rank) ->
  // [N, out_channels / tp, H', W'] (this rank's output channels), or
  // [N, out_channels, H', W'] when gather_output.
  at::Tensor forward(const at::Tensor& input);

  ParallelStyle parallelStyle() const override { return ParallelStyle::kColumn; }
  std::vector<std::pair<std::string, int>> splitParameters() const override;

  ParallelConv2dOptions options;
  bool gather_output = false;  // all-gather the output channels on every rank
  at::Tensor weight;           // [out_channels (/ tp), in_channels, kh, kw]
  at::Tensor bias;             // [out_channels (/ tp)] or undefined
};
TORCH_MODULE(ColumnParallelConv2d);

class PTRAIN_API RowParallelConv2dImpl : public torch::nn::Module, public ParallelLayer {
 public:
  explicit RowParallelConv2dImpl(const ParallelConv2dOptions& options);
  ~RowParallelConv2dImpl() override;
  // input [N, in_channels / tp, H, W] (this rank's input channels, as a
  // column-parallel conv produces them; [N, in_channels, H, W] when
  // !input_is_parallel) -> [N, out_channels, H', W'], summed over the group,
  // the same on every rank.
  at::Tensor forward(const at::Tensor& input);

  ParallelStyle parallelStyle() const override { return ParallelStyle::kRow; }
  std::vector<std::pair<std::string, int>> splitParameters() const override;

  ParallelConv2dOptions options;
  bool input_is_parallel = true;  // false: keep this rank's channels of the full input here
  at::Tensor weight;              // [out_channels, in_channels (/ tp), kh, kw]
  at::Tensor bias;                // [out_channels] or undefined; added after the reduction
};
TORCH_MODULE(RowParallelConv2d);

class PTRAIN_API ChannelParallelBatchNorm2dImpl : public torch::nn::Module, public ParallelLayer {
 public:
  // Affine weight 1, bias 0, running mean 0 and variance 1, as torch's.
  explicit ChannelParallelBatchNorm2dImpl(int64_t numFeatures, double eps = 1e-5, double momentum = 0.1);
  ~ChannelParallelBatchNorm2dImpl() override;
  // input [N, num_features / tp, H, W] (this rank's channels) -> the same
  // shape. Training mode normalises with the batch statistics of each channel
  // and updates the running statistics; eval mode uses the running ones.
  at::Tensor forward(const at::Tensor& input);

  ParallelStyle parallelStyle() const override { return ParallelStyle::kColumn; }
  std::vector<std::pair<std::string, int>> splitParameters() const override;

  int64_t num_features;  // full (unsharded) channels
  double eps;
  double momentum;
  at::Tensor weight;        // [num_features (/ tp)]
  at::Tensor bias;          // [num_features (/ tp)]
  at::Tensor running_mean;  // buffer [num_features (/ tp)]
  at::Tensor running_var;   // buffer [num_features (/ tp)]

 private:
  // Buffers are not parameters, so applyTensorParallel leaves them whole:
  // keep this rank's slice once the layer runs sharded.
  void shardRunningStatistics();
};
TORCH_MODULE(ChannelParallelBatchNorm2d);

class PTRAIN_API ChannelParallelGroupNormImpl : public torch::nn::Module, public ParallelLayer {
 public:
  // Affine weight 1, bias 0, as torch's. Throws InternalError when
  // numGroups does not divide numChannels.
  ChannelParallelGroupNormImpl(int64_t numGroups, int64_t numChannels, double eps = 1e-5);
  ~ChannelParallelGroupNormImpl() override;
  // input [N, num_channels / tp, H, W] (this rank's channels) -> the same
  // shape, normalised over each of this rank's num_groups / tp groups.
  // Throws ConfigError when tp does not divide num_groups (a group would
  // straddle two ranks).
  at::Tensor forward(const at::Tensor& input);

  ParallelStyle parallelStyle() const override { return ParallelStyle::kColumn; }
  std::vector<std::pair<std::string, int>> splitParameters() const override;

  int64_t num_groups;    // full (unsharded) sizes
  int64_t num_channels;
  double eps;
  at::Tensor weight;     // [num_channels (/ tp)]
  at::Tensor bias;       // [num_channels (/ tp)]
};
TORCH_MODULE(ChannelParallelGroupNorm);

}  // namespace ptrain::nn

#include "ptrain/nn/parallel_conv.h"

#include <torch/torch.h>

#include <cmath>

#include "ptrain/nn/deferred_init.h"

namespace ptrain::nn {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kChannelDim = 1;  // NCHW

// The autograd context keeps the state's address (IValue holds no C++
// object); the state outlives the graph, as for tp_comm.h's functions.
const TensorParallelState& stateOf(AutogradContext* ctx) {
  return *reinterpret_cast<const TensorParallelState*>(ctx->saved_data["tp"].toInt());
}

// Forward all-gather of the channel shards; backward keeps this rank's
// channels of the gradient (every rank uses the gathered tensor alike).
struct GatherChannels : torch::autograd::Function<GatherChannels> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const TensorParallelState* tp) {
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    return allGatherAlong(input, *tp, kChannelDim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {splitAlong(grads[0], stateOf(ctx), kChannelDim), at::Tensor()};
  }
};

// Forward keeps this rank's channels of a replicated tensor; backward
// all-gathers the gradient.
struct ScatterChannels : torch::autograd::Function<ScatterChannels> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const TensorParallelState* tp) {
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    return splitAlong(input, *tp, kChannelDim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {allGatherAlong(grads[0], stateOf(ctx), kChannelDim), at::Tensor()};
  }
};

void checkGeometry(const ParallelConv2dOptions& o, const char* layer) {
  PTRAIN_CHECK(o.in_channels > 0 && o.out_channels > 0, layer, ": channels must be positive, got in ", o.in_channels,
               " out ", o.out_channels);
  for (int i = 0; i < 2; ++i) {
    PTRAIN_CHECK(o.kernel_size[i] > 0 && o.stride[i] > 0 && o.dilation[i] > 0 && o.padding[i] >= 0, layer,
                 ": kernel, stride and dilation must be positive and padding non-negative");
  }
}

// torch's Conv2d initialisation (kaiming_uniform_ with a = sqrt(5), which
// is uniform in +-1/sqrt(fan_in), and the bias in the same bound) from the
// default generator for a layer built on its own; under a DeferredInit (a
// runtime's build) the splittable parameters come without storage and the
// runtime draws this rank's slice from the model's rule. A row-parallel bias
// is replicated.
void initConv(torch::nn::Module& m, const ParallelConv2dOptions& o, at::Tensor& weight, at::Tensor& bias,
              bool splittableBias) {
  const int64_t fanIn = o.in_channels * o.kernel_size[0] * o.kernel_size[1];
  const double bound = 1.0 / std::sqrt(static_cast<double>(fanIn));
  const std::vector<int64_t> sizes{o.out_channels, o.in_channels, o.kernel_size[0], o.kernel_size[1]};
  weight = m.register_parameter(
      "weight", splittableParameter(sizes, [&] { return torch::empty(sizes).uniform_(-bound, bound); }));
  if (!o.bias) return;
  auto makeBias = [&] { return torch::empty({o.out_channels}).uniform_(-bound, bound); };
  bias = m.register_parameter("bias", splittableBias ? splittableParameter({o.out_channels}, makeBias) : makeBias());
}

at::Tensor conv(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                const ParallelConv2dOptions& o) {
  return at::conv2d(input, weight, bias, o.stride, o.padding, o.dilation, 1);
}

}  // namespace

ColumnParallelConv2dImpl::ColumnParallelConv2dImpl(const ParallelConv2dOptions& opts) : options(opts) {
  checkGeometry(options, "ColumnParallelConv2d");
  initConv(*this, options, weight, bias, /*splittableBias=*/true);
}

ColumnParallelConv2dImpl::~ColumnParallelConv2dImpl() = default;

at::Tensor ColumnParallelConv2dImpl::forward(const at::Tensor& input) {
  if (!parallel()) return conv(input, weight, bias, options);
  // Every rank reads the whole input through its own filters, so the input
  // gradient is a partial sum per rank: all-reduced backward.
  at::Tensor out = conv(copyToTpRegion(input, *tp_), weight, bias, options);
  return gather_output ? GatherChannels::apply(out, tp_.get()) : out;
}

std::vector<std::pair<std::string, int>> ColumnParallelConv2dImpl::splitParameters() const {
  std::vector<std::pair<std::string, int>> out{{"weight", 0}};
  if (bias.defined()) out.emplace_back("bias", 0);
  return out;
}

RowParallelConv2dImpl::RowParallelConv2dImpl(const ParallelConv2dOptions& opts) : options(opts) {
  checkGeometry(options, "RowParallelConv2d");
  initConv(*this, options, weight, bias, /*splittableBias=*/false);
}

RowParallelConv2dImpl::~RowParallelConv2dImpl() = default;

at::Tensor RowParallelConv2dImpl::forward(const at::Tensor& input) {
  if (!parallel()) return conv(input, weight, bias, options);
  at::Tensor x = input_is_parallel ? input : ScatterChannels::apply(input, tp_.get());
  // A convolution is a sum over input channels: each rank's part, summed.
  at::Tensor out = reduceFromTpRegion(conv(x, weight, at::Tensor(), options), *tp_);
  // After the sum: added once, not once per rank.
  return bias.defined() ? out + bias.view({1, -1, 1, 1}) : out;
}

std::vector<std::pair<std::string, int>> RowParallelConv2dImpl::splitParameters() const { return {{"weight", 1}}; }

ChannelParallelBatchNorm2dImpl::ChannelParallelBatchNorm2dImpl(int64_t numFeatures, double epsilon, double momentumFactor)
    : num_features(numFeatures), eps(epsilon), momentum(momentumFactor) {
  PTRAIN_CHECK(numFeatures > 0, "ChannelParallelBatchNorm2d: num_features must be positive, got ", numFeatures);
  weight = register_parameter("weight", splittableParameter({numFeatures}, [&] { return torch::ones({numFeatures}); }));
  bias = register_parameter("bias", splittableParameter({numFeatures}, [&] { return torch::zeros({numFeatures}); }));
  running_mean = register_buffer("running_mean", torch::zeros({numFeatures}));
  running_var = register_buffer("running_var", torch::ones({numFeatures}));
}

ChannelParallelBatchNorm2dImpl::~ChannelParallelBatchNorm2dImpl() = default;

void ChannelParallelBatchNorm2dImpl::shardRunningStatistics() {
  if (!parallel() || running_mean.size(0) == weight.size(0)) return;
  PTRAIN_CHECK(running_mean.size(0) == num_features && weight.size(0) * tp_->size == num_features,
               "ChannelParallelBatchNorm2d: running statistics of ", running_mean.size(0), " channels for a weight of ",
               weight.size(0), " on ", tp_->size, " ranks");
  torch::NoGradGuard noGrad;
  const int64_t chunk = weight.size(0);
  // set_data keeps the registered buffer object: named_buffers() sees the slice.
  running_mean.set_data(running_mean.narrow(0, tp_->rank * chunk, chunk).clone());
  running_var.set_data(running_var.narrow(0, tp_->rank * chunk, chunk).clone());
}

at::Tensor ChannelParallelBatchNorm2dImpl::forward(const at::Tensor& input) {
  shardRunningStatistics();
  // Mean and variance are per channel, and each rank holds whole channels for
  // the whole (data-parallel-local) batch: the sharded result is exact.
  return torch::batch_norm(input, weight, bias, running_mean, running_var, is_training(), momentum, eps,
                           at::globalContext().userEnabledCuDNN());
}

std::vector<std::pair<std::string, int>> ChannelParallelBatchNorm2dImpl::splitParameters() const {
  return {{"weight", 0}, {"bias", 0}};
}

ChannelParallelGroupNormImpl::ChannelParallelGroupNormImpl(int64_t numGroups, int64_t numChannels, double epsilon)
    : num_groups(numGroups), num_channels(numChannels), eps(epsilon) {
  PTRAIN_CHECK(numGroups > 0 && numChannels > 0 && numChannels % numGroups == 0,
               "ChannelParallelGroupNorm: ", numGroups, " groups do not divide ", numChannels, " channels");
  weight = register_parameter("weight", splittableParameter({numChannels}, [&] { return torch::ones({numChannels}); }));
  bias = register_parameter("bias", splittableParameter({numChannels}, [&] { return torch::zeros({numChannels}); }));
}

ChannelParallelGroupNormImpl::~ChannelParallelGroupNormImpl() = default;

at::Tensor ChannelParallelGroupNormImpl::forward(const at::Tensor& input) {
  int64_t groups = num_groups;
  if (parallel()) {
    // Groups are contiguous channel ranges, as are the shards: with whole
    // groups per rank every group's statistics are local to one rank.
    PTRAIN_CHECK_AS(ConfigError, num_groups % tp_->size == 0, "parallel.tensor_model_parallel_size: ", tp_->size,
                    " does not divide the ", num_groups, " groups of a ChannelParallelGroupNorm over ", num_channels,
                    " channels (a group would straddle two ranks); use a size that divides ", num_groups);
    groups = num_groups / tp_->size;
  }
  return torch::group_norm(input, groups, weight, bias, eps, at::globalContext().userEnabledCuDNN());
}

std::vector<std::pair<std::string, int>> ChannelParallelGroupNormImpl::splitParameters() const {
  return {{"weight", 0}, {"bias", 0}};
}

}  // namespace ptrain::nn

#include "ptrain/nn/parameter_init.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace ptrain::nn {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr double kTwoPi = 6.283185307179586476925286766559;

// Counter c's uniform in [0, 1) with 53 random bits.
double uniformAt(uint64_t seed, uint64_t counter) {
  return static_cast<double>(splitmix64(seed + counter * kGolden) >> 11) * 0x1.0p-53;
}

// Writes `count` values of the whole tensor's flat positions [first, first +
// count) to out[0..count).
template <typename T>
void drawRun(const ParameterInit& init, uint64_t first, int64_t count, T* out) {
  if (init.kind == ParameterInit::Kind::kUniform) {
    const double span = init.b - init.a;
    for (int64_t j = 0; j < count; ++j) out[j] = static_cast<T>(init.a + span * uniformAt(init.seed, first + j + 1));
    return;
  }
  // Normal: one Box-Muller pair per two positions; a run may start or end
  // inside a pair.
  const uint64_t end = first + static_cast<uint64_t>(count);
  for (uint64_t pair = first / 2; pair * 2 < end; ++pair) {
    // u1 in (0, 1]: the logarithm stays finite.
    const double u1 = 1.0 - uniformAt(init.seed, 2 * pair + 1);
    const double u2 = uniformAt(init.seed, 2 * pair + 2);
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double t = kTwoPi * u2;
    const uint64_t even = 2 * pair;
    if (even >= first) out[even - first] = static_cast<T>(init.a + init.b * (r * std::cos(t)));
    if (even + 1 < end) out[even + 1 - first] = static_cast<T>(init.a + init.b * (r * std::sin(t)));
  }
}

template <typename T>
void fillRandom(at::Tensor& shard, const ParameterInit& init, const std::vector<int64_t>& fullSizes,
                const std::vector<int64_t>& offsets) {
  const int64_t dims = shard.dim();
  T* data = shard.data_ptr<T>();
  if (dims == 0) {
    drawRun(init, 0, 1, data);
    return;
  }
  // Row-major strides of the whole tensor.
  std::vector<uint64_t> fullStride(static_cast<size_t>(dims), 1);
  for (int64_t d = dims - 2; d >= 0; --d) {
    fullStride[static_cast<size_t>(d)] = fullStride[static_cast<size_t>(d + 1)] * static_cast<uint64_t>(fullSizes[d + 1]);
  }
  const int64_t width = shard.size(dims - 1);
  if (width == 0) return;
  const int64_t rows = shard.numel() / width;
  // Each row of the shard is one run of consecutive positions of the whole
  // tensor; wide rows are cut so that every thread gets work.
  const int64_t piece = std::max<int64_t>(1, std::min<int64_t>(width, 1 << 14));
  const int64_t piecesPerRow = (width + piece - 1) / piece;
  at::parallel_for(0, rows * piecesPerRow, std::max<int64_t>(1, (1 << 15) / piece), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> index(static_cast<size_t>(dims), 0);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t row = item / piecesPerRow;
      const int64_t col = (item % piecesPerRow) * piece;
      const int64_t count = std::min(piece, width - col);
      // The row's position in the whole tensor.
      uint64_t first = 0;
      int64_t rest = row;
      for (int64_t d = dims - 2; d >= 0; --d) {
        const int64_t size = shard.size(d);
        index[static_cast<size_t>(d)] = rest % size;
        rest /= size;
        first += static_cast<uint64_t>(index[static_cast<size_t>(d)] + offsets[static_cast<size_t>(d)]) *
                 fullStride[static_cast<size_t>(d)];
      }
      first += static_cast<uint64_t>(offsets[static_cast<size_t>(dims - 1)] + col);
      drawRun(init, first, count, data + row * width + col);
    }
  });
}

}  // namespace

uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

ParameterInit ParameterInit::constant(double value) {
  ParameterInit init;
  init.kind = Kind::kConstant;
  init.a = value;
  return init;
}

ParameterInit ParameterInit::normal(uint64_t seed, double mean, double std) {
  ParameterInit init;
  init.kind = Kind::kNormal;
  init.seed = seed;
  init.a = mean;
  init.b = std;
  return init;
}

ParameterInit ParameterInit::uniform(uint64_t seed, double low, double high) {
  ParameterInit init;
  init.kind = Kind::kUniform;
  init.seed = seed;
  init.a = low;
  init.b = high;
  return init;
}

ParameterInit ParameterInit::custom(Fill fill) {
  PTRAIN_CHECK(fill != nullptr, "ParameterInit::custom: no fill function");
  ParameterInit init;
  init.kind = Kind::kCustom;
  init.fill = std::move(fill);
  return init;
}

void fillShard(at::Tensor& shard, const ParameterInit& init, const std::vector<int64_t>& fullSizes,
               const std::vector<int64_t>& offsets) {
  PTRAIN_CHECK(shard.defined() && shard.is_cpu() && shard.is_contiguous(),
               "fillShard: needs a contiguous host tensor");
  PTRAIN_CHECK(static_cast<int64_t>(fullSizes.size()) == shard.dim() &&
                   static_cast<int64_t>(offsets.size()) == shard.dim(),
               "fillShard: a ", shard.dim(), "-d shard of a ", fullSizes.size(), "-d tensor at ", offsets.size(),
               " offsets");
  for (int64_t d = 0; d < shard.dim(); ++d) {
    const auto i = static_cast<size_t>(d);
    PTRAIN_CHECK(offsets[i] >= 0 && offsets[i] + shard.size(d) <= fullSizes[i], "fillShard: the shard's dimension ",
                 d, " [", offsets[i], ", ", offsets[i] + shard.size(d), ") is outside the whole size ", fullSizes[i]);
  }
  torch::NoGradGuard noGrad;
  switch (init.kind) {
    case ParameterInit::Kind::kConstant:
      shard.fill_(init.a);
      return;
    case ParameterInit::Kind::kCustom:
      init.fill(shard, offsets);
      return;
    case ParameterInit::Kind::kNormal:
    case ParameterInit::Kind::kUniform:
      break;
  }
  if (shard.scalar_type() == at::kFloat) {
    fillRandom<float>(shard, init, fullSizes, offsets);
  } else if (shard.scalar_type() == at::kDouble) {
    fillRandom<double>(shard, init, fullSizes, offsets);
  } else {
    PTRAIN_CHECK(at::isFloatingType(shard.scalar_type()), "fillShard: a ", shard.scalar_type(),
                 " tensor cannot take random values");
    // Drawn in float32 and rounded once, as a float32 model cast to this dtype.
    at::Tensor values = torch::empty(shard.sizes(), shard.options().dtype(at::kFloat));
    fillRandom<float>(values, init, fullSizes, offsets);
    shard.copy_(values);
  }
}

uint64_t modelSeed() {
  return static_cast<uint64_t>(
      torch::randint(std::numeric_limits<int64_t>::max(), {1}, torch::kInt64).item<int64_t>());
}

at::Tensor drawParameter(const ParameterInit& init, const std::vector<int64_t>& fullSizes,
                         const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes) {
  const std::vector<int64_t> at0(fullSizes.size(), 0);
  const std::vector<int64_t>& start = offsets.empty() ? at0 : offsets;
  const std::vector<int64_t>& shape = sizes.empty() ? fullSizes : sizes;
  PTRAIN_CHECK(start.size() == fullSizes.size() && shape.size() == fullSizes.size(),
               "drawParameter: offsets and sizes need one entry per dimension of the parameter");
  at::Tensor block = torch::empty(shape, torch::kFloat32);
  fillShard(block, init, fullSizes, start);
  return block;
}

at::Generator seededGenerator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

}  // namespace ptrain::nn

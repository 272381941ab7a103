// How a parameter starts: a rule a model states per parameter, drawn position
// by position, so that any block of the parameter (one rank's shard) is drawn
// without the rest and equals that block of the whole tensor's draw, bit for
// bit.
//
// Every random value is a pure function of (the parameter's seed, the
// element's row-major index in the whole tensor) through splitmix64, the
// counter-based scheme nn::EmbeddingTables uses for its rows:
//   normal   elements 2k and 2k+1 are the two outputs of one Box-Muller pair
//            drawn from counters 2k+1 and 2k+2: r = sqrt(-2 ln u1),
//            t = 2 pi u2, z(2k) = r cos t, z(2k+1) = r sin t; value mean + std z;
//   uniform  element i is low + (high - low) u, u from counter i + 1;
// computed in float64 and rounded to the tensor's dtype. So a tensor-parallel
// rank, an expert rank or a pipeline stage that builds only its part of a
// parameter gets exactly the values the one-rank model has there, and no rank
// ever draws (or holds) the whole tensor to cut its part out.
//
// Thread-safety: fillShard may run on any thread; it splits its work over
// libtorch's intra-op threads (the values do not depend on the split).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain::nn {

struct PTRAIN_API ParameterInit {
  enum class Kind { kConstant, kNormal, kUniform, kCustom };
  // Fills `shard`, the block of the whole tensor whose first element sits at
  // `offsets` (one per dimension), with the values the rule gives there.
  using Fill = std::function<void(at::Tensor& shard, const std::vector<int64_t>& offsets)>;

  Kind kind = Kind::kConstant;
  uint64_t seed = 0;  // the parameter's own stream (parameterSeed(base, name))
  double a = 0;       // constant: the value; normal: the mean; uniform: the low end
  double b = 0;       // normal: the standard deviation; uniform: the high end
  Fill fill;          // kCustom only

  static ParameterInit constant(double value);
  static ParameterInit normal(uint64_t seed, double mean, double std);
  static ParameterInit uniform(uint64_t seed, double low, double high);
  // A rule of the model's own (e.g. a table pack whose rows belong to several
  // tables). It must fill any block the same as the whole tensor's draw does.
  static ParameterInit custom(Fill fill);
};

// Fills `shard` (a contiguous host tensor, float32 or float64) with the values
// `init` gives the block of a tensor of `fullSizes` that starts at `offsets`
// and has the shard's sizes. Throws InternalError when the block does not lie
// inside the whole tensor or the shard is not a contiguous host float tensor.
PTRAIN_API void fillShard(at::Tensor& shard, const ParameterInit& init, const std::vector<int64_t>& fullSizes,
                          const std::vector<int64_t>& offsets);

// splitmix64's finaliser: the hash every counter-based draw goes through.
PTRAIN_API uint64_t splitmix64(uint64_t z);

// The helpers a model needs to start its parameters as the engine requires
// (Trainer::buildModel's contract), without libtorch's generator internals:
//
//   base_seed_ = nn::modelSeed();                       // once, as the model is built
//   auto init = nn::ParameterInit::normal(parameterSeed(base_seed_, name), 0, 0.02);
//   at::Tensor block = nn::drawParameter(init, {rows, cols}, {row0, 0}, {myRows, cols});
//
// modelSeed: one draw of libtorch's default CPU generator, which the engine
// seeds with train.seed before it builds a model, so equal seeds give equal
// models on every rank and layout. Every parameter's own stream is then
// parameterSeed(modelSeed(), its name) (nn/parameter_seed.h).
PTRAIN_API uint64_t modelSeed();

// A new float32 host tensor holding the block of a parameter of `fullSizes`
// that starts at `offsets` and has `sizes` (the whole tensor when both are
// empty), drawn by `init` (fillShard): what a rank that holds only that block
// of the parameter starts from. Throws InternalError for a block outside the
// tensor.
PTRAIN_API at::Tensor drawParameter(const ParameterInit& init, const std::vector<int64_t>& fullSizes,
                                    const std::vector<int64_t>& offsets = {}, const std::vector<int64_t>& sizes = {});

// A CPU random generator of its own, seeded with `seed` (e.g. for sampling or
// a data order), independent of the default one.
PTRAIN_API at::Generator seededGenerator(uint64_t seed);

}  // namespace ptrain::nn

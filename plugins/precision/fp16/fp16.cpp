// precision/fp16: float16 parameters and activations, float32 master weights
// and gradient accumulation, and a constant or dynamic loss scale
// (mixed_precision.h, engine/loss_scaler.h).
#include "mixed_precision.h"
#include "ptrain/recipe/key_specs.h"

namespace ptrain {
namespace {

class Fp16Precision final : public MixedPrecision {
 public:
  explicit Fp16Precision(const PluginContext& ctx) : MixedPrecision(ctx, at::kHalf, /*scaled=*/true) {}

  // The loss scale's keys (Megatron-LM's names and semantics), read through
  // precisionSettings (engine/precision.h).
  static void recipeKeys(Schema& s) {
    using T = ValueType;
    using keys::above;
    using keys::atLeast;
    using keys::key;
    s.add(atLeast(key("precision.loss_scale", T::kFloat, "0", "fp16: 0 scales the loss dynamically; a positive value is a constant scale."), 0));
    s.add(above(key("precision.initial_loss_scale", T::kFloat, "4294967296", "fp16, dynamic: the scale of the first step (2^32)."), 0));
    s.add(above(key("precision.min_loss_scale", T::kFloat, "1", "fp16, dynamic: the scale never backs off below this."), 0));
    s.add(atLeast(key("precision.loss_scale_window", T::kInt, "1000", "fp16, dynamic: clean steps in a row before the scale doubles."), 1));
    s.add(atLeast(key("precision.hysteresis", T::kInt, "2", "fp16, dynamic: overflowing steps tolerated before the scale halves."), 1));
    s.add(key("precision.fp16_lm_cross_entropy", T::kBool, "false", "fp16: the output projection's cross-entropy in fp16 (true) or fp32 (false)."));
  }
};

}  // namespace
}  // namespace ptrain

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kPrecision, "fp16", "0.1.0", ptrain::Fp16Precision)

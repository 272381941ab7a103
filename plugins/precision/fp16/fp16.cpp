// precision/fp16: float16 parameters and activations, float32 master weights
// and gradient accumulation, and a constant or dynamic loss scale
// (mixed_precision.h, engine/loss_scaler.h).
#include "mixed_precision.h"

namespace ptrain {
namespace {

class Fp16Precision final : public MixedPrecision {
 public:
  explicit Fp16Precision(const PluginContext& ctx) : MixedPrecision(ctx, at::kHalf, /*scaled=*/true) {}
};

}  // namespace
}  // namespace ptrain

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kPrecision, "fp16", "0.1.0", ptrain::Fp16Precision)

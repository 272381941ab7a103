// precision/fp32: float32 parameters, activations and gradients; the default.
#include "mixed_precision.h"

namespace ptrain {
namespace {

class Fp32Precision final : public MixedPrecision {
 public:
  explicit Fp32Precision(const PluginContext& ctx) : MixedPrecision(ctx, at::kFloat, /*scaled=*/false) {}
};

}  // namespace
}  // namespace ptrain

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kPrecision, "fp32", "0.1.0", ptrain::Fp32Precision)

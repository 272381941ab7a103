// precision/bf16: bf16 parameters and activations, float32 master weights and
// gradient accumulation (mixed_precision.h).
#include "mixed_precision.h"

namespace ptrain {
namespace {

class Bf16Precision final : public MixedPrecision {
 public:
  explicit Bf16Precision(const PluginContext& ctx) : MixedPrecision(ctx, at::kBFloat16, /*scaled=*/false) {}
};

}  // namespace
}  // namespace ptrain

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kPrecision, "bf16", "0.1.0", ptrain::Bf16Precision)

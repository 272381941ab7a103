// offload/tiered: parameters, gradients and optimizer states rest in a tier
// below the device's memory and come in only while they are used
// (engine/offload.h for the keys and the contract). The tier follows the
// device the model computes on: files on disk for the cpu (disk_tier.cpp),
// pinned host memory for a GPU (pinned_tier.cpp). This class only hands each
// call to the tier's implementation.
#include <torch/torch.h>

#include "ptrain/core/error.h"
#include "ptrain/recipe/key_specs.h"
#include "tiers.h"

namespace ptrain {
namespace {

std::unique_ptr<OffloadPlugin> tierFor(const PluginContext& ctx) {
  if (ctx.device.is_cuda()) return makePinnedOffload(ctx);
  PTRAIN_CHECK_AS(ConfigError, ctx.device.is_cpu(), "offload/tiered: no tier serves the device ", ctx.device.str(),
                  "; turn offload off");
  return makeDiskOffload(ctx);
}

class TieredOffload final : public OffloadPlugin {
 public:
  explicit TieredOffload(const PluginContext& ctx) : tier_(tierFor(ctx)) {}

  // Which tier: the levers themselves (offload.params, .grads, .optimizer)
  // are the engine's, which calls any offload plugin's hooks for them.
  static void recipeKeys(Schema& s) {
    using T = ValueType;
    using keys::key;
    using keys::oneOf;
    s.add(oneOf(key("offload.tier", T::kString, "auto", "Where offloaded tensors rest: `disk` (memory-mapped files under the run folder's offload/, on cpu), `pinned` (page-locked host memory, on cuda); `auto` picks the tier of the device."),
                {"auto", "disk", "pinned"}));
  }

  void attachModel(StagedModel& model, const OffloadSettings& settings) override {
    tier_->attachModel(model, settings);
  }
  void attachOptimizer(Optimizer& optimizer) override { tier_->attachOptimizer(optimizer); }

  void beginStep(const StepInfo& info) override { tier_->beginStep(info); }
  double lossScale() override { return tier_->lossScale(); }
  void beforeMicroBatches(double lossScale) override { tier_->beforeMicroBatches(lossScale); }
  at::Tensor runBlock(int index, const at::Tensor& input, const BlockRunner& next) override {
    return tier_->runBlock(index, input, next);
  }
  bool observesBlockBackward() const override { return tier_->observesBlockBackward(); }
  void beforeBlockBackward(int index) override { tier_->beforeBlockBackward(index); }
  void afterBlockBackward(int index) override { tier_->afterBlockBackward(index); }
  void beforeBackward(int index, int count) override { tier_->beforeBackward(index, count); }
  void finishGradients() override { tier_->finishGradients(); }
  bool mayStep(const GradientCheck& check) override { return tier_->mayStep(check); }
  void afterStep(const StepResult& result) override { tier_->afterStep(result); }
  std::map<std::string, double> stepStats() const override { return tier_->stepStats(); }

 private:
  std::unique_ptr<OffloadPlugin> tier_;
};

}  // namespace
}  // namespace ptrain

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kOffload, "tiered", "0.1.0", ptrain::TieredOffload)

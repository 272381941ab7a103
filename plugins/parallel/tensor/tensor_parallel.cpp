// parallel/tensor: Megatron-style tensor parallelism.
//
// apply() splits the model's ptrain::nn parallel layers across this rank's
// tensor-parallel group (ptrain::nn::applyTensorParallel: column-parallel
// weights by output rows, row-parallel weights by input columns, the
// vocabulary by rows), records every split in the model's placement and
// hands every layer and the model the group. The layers then communicate inside
// forward and backward (ptrain/nn/tp_comm.h).
//
// With parallel.sequence_parallel, LayerNorm weights and biases and the
// row-parallel biases act on sequence shards, so their gradients are partial
// sums per rank: finishGradients() all-reduces them (one flat buffer) over the
// group. The engine calls it after the data plugin's, so they are final then.
//
// stepStats(): tp_comm_bytes, the bytes of every tensor the layers and this
// plugin communicated during the step (docs/tensor_parallel.md has the count).
#include <torch/torch.h>

#include "ptrain/comm/communicator.h"
#include "ptrain/core/logging.h"
#include "ptrain/engine/gradients.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/parallel.h"
#include "ptrain/engine/tensor_parallel.h"
#include "ptrain/recipe/recipe.h"

namespace {

using namespace ptrain;

class TensorParallel final : public ParallelPlugin {
 public:
  // The layout dimensions it executes: Megatron tensor parallelism (and sequence parallelism inside the tp group).
  static constexpr const char* kExecutes = "tp";
  explicit TensorParallel(const PluginContext& ctx) : device_(ctx.device) {
    if (ctx.recipe != nullptr) sequenceParallel_ = ctx.recipe->getBool("parallel.sequence_parallel");
  }

  // Narrows the planned parameters (built without storage) to this rank's
  // slices and records the splits.
  void shard(StagedModel& model, const LayoutGroups& groups) override {
    auto group = groups.group(GroupKind::kTensor);
    state_ = nn::TensorParallelState::create(group, sequenceParallel_ && group->size() > 1);
    partialNames_ = nn::shardTensorParallel(model, *state_);
  }

  void apply(StagedModel& model, const LayoutGroups& groups) override {
    PTRAIN_CHECK(state_ != nullptr, "parallel/tensor: apply() before shard()");
    nn::setTensorParallelState(model, state_);
    auto named = model.module().named_parameters();
    auto group = state_->group;
    for (const auto& name : partialNames_) partial_.push_back(named[name]);
    size_t split = 0;
    for (const auto& item : named) split += model.placement.of(item.key()).shardAlong(GroupKind::kTensor) ? 1 : 0;
    logger()->debug("tensor parallel over {}: {} split parameters{}", group->name(), split,
                    state_->sequence_parallel
                        ? ", sequence parallel with " + std::to_string(partial_.size()) + " partial gradients"
                        : std::string());
  }

  void beginStep(const StepInfo&) override { state_->comm_bytes = 0; }

  void finishGradients() override { state_->comm_bytes += allReduceGradients(partial_, *state_->group, device_); }

  std::map<std::string, double> stepStats() const override {
    if (!state_) return {};
    return {{"tp_comm_bytes", static_cast<double>(state_->comm_bytes.load())}};
  }

 private:
  at::Device device_;
  bool sequenceParallel_ = false;
  std::shared_ptr<nn::TensorParallelState> state_;
  std::vector<std::string> partialNames_;
  std::vector<at::Tensor> partial_;  // parameters whose gradients are all-reduced in finishGradients
};

}  // namespace

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kParallel, "tensor", "0.1.0", TensorParallel)

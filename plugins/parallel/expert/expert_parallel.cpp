// parallel/expert: expert parallelism for the model's MoE layers
// (ptrain/nn/moe.h), in Megatron-core's terms.
//
// The runtime creates it for every model with experts, whatever ep (at ep=1
// it places the experts and keeps the step's MoE figures). shard():
//   - narrows every expert tensor ([E, ...]), built without storage, to this
//     rank's E / ep experts (dimension 0, in ep-group order), which the
//     runtime then allocates and draws alone, so the run starts from the
//     slices of the single-rank initialisation; records the split (axis kExpert) in
//     the placement, with the parameter in the expert grid etp x ep x edp x
//     pp: the data plugin sums its gradient over edp, norms count each expert
//     once, checkpoints gather every expert (a run saved at one ep resumes at
//     any other);
//   - under expert tensor parallelism (etp > 1) also narrows each expert's
//     fc1 by output features and fc2 by input features (axis kExpertTensor);
//     fc2's bias stays whole, added by etp member 0, and finishGradients sums
//     its gradient over etp;
// apply():
//   - hands each layer the ep and etp groups and, under sequence parallelism, the
//     tensor group (its ranks hold the other parts of the same sequences,
//     over which the load-balancing loss counts tokens);
//   - sets model.forward_sync (the world) when ep > 1, so that inference that
//     decodes until every sequence stops keeps the ranks in step.
//
// Each step the layers' auxiliary losses get the gradient loss scale / the
// micro-batches of the global batch (what Megatron's MoEAuxLossAutoScaler is
// set to, with the data-parallel average folded in, since ptrain sums
// gradients over dp); afterStep sums the layers' figures over the world and
// stepStats reports them: moe_aux_loss and moe_z_loss (per micro-batch,
// summed over layers), moe_tokens_min / max / cv (tokens per expert and
// layer over the global batch, and their coefficient of variation),
// moe_dropped_fraction, moe_a2a_bytes (token bytes sent to other ranks by the
// all-to-alls, forward and backward), moe_a2a_bytes_uniform (the analytic
// count for uniform routing) and moe_a2a_s (time in them, summed over ranks).
#include <torch/torch.h>

#include <cmath>

#include "ptrain/comm/communicator.h"
#include "ptrain/core/logging.h"
#include "ptrain/engine/gradients.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/parallel.h"
#include "ptrain/nn/deferred_init.h"
#include "ptrain/nn/moe.h"
#include "ptrain/recipe/recipe.h"

namespace {

using namespace ptrain;

class ExpertParallel final : public ParallelPlugin {
 public:
  // The layout dimensions it executes: the experts over the expert grid.
  static constexpr const char* kExecutes = "ep,etp";
  explicit ExpertParallel(const PluginContext& ctx) : device_(ctx.device) {
    if (ctx.recipe != nullptr) sequenceParallel_ = ctx.recipe->getBool("parallel.sequence_parallel");
  }

  // Keeps this rank's experts of every stacked expert tensor (built without
  // storage) and, under expert tensor parallelism, its share of their
  // features; records the splits and the expert grid.
  void shard(StagedModel& model, const LayoutGroups& groups) override {
    auto ep = groups.group(GroupKind::kExpert);
    auto etp = groups.group(GroupKind::kExpertTensor);
    const auto layers = model.moeLayers();
    PTRAIN_CHECK_AS(ConfigError, model.numExperts() > 0, "parallel.expert_model_parallel_size=", ep->size(),
                    ": the model has no MoE layers; set model.num_experts or expert_model_parallel_size: 1");
    torch::NoGradGuard noGrad;
    auto named = model.module().named_parameters();
    for (const auto& [prefix, layer] : layers) {
      const int64_t total = layer->config().num_experts;
      PTRAIN_CHECK_AS(ConfigError, total % ep->size() == 0, "parallel.expert_model_parallel_size=", ep->size(),
                      " does not divide model.num_experts=", total);
      const int64_t local = total / ep->size();
      const int64_t ffn = layer->config().ffn_hidden_size;
      PTRAIN_CHECK_AS(ConfigError, ffn % etp->size() == 0, "parallel.expert_tensor_parallel_size=", etp->size(),
                      " does not divide the experts' ffn_hidden_size=", ffn);
      for (const auto& relative : nn::MoeLayerImpl::expertParameterNames()) {
        const std::string name = prefix + relative;
        at::Tensor& p = named[name];
        model.placement.edit(name).grid = ParamGrid::kExpert;
        if (ep->size() > 1) {
          nn::narrowParameter(p, 0, ep->rank() * local, local);
          model.placement.addShard(name, ShardSpec{GroupKind::kExpert, 0, ep->size(), ep->rank(), total});
        }
        if (etp->size() == 1) continue;
        // fc1 by its output features, fc2 by its input features; fc2's bias
        // whole, added by member 0 only, its gradient summed over etp (apply).
        const int dim = relative == "experts.fc2.weight" ? 2 : relative.rfind("experts.fc1.", 0) == 0 ? 1 : -1;
        if (dim < 0) {
          model.placement.edit(name).partial_gradient = true;
          continue;
        }
        const int64_t slice = ffn / etp->size();
        nn::narrowParameter(p, dim, etp->rank() * slice, slice);
        model.placement.addShard(name, ShardSpec{GroupKind::kExpertTensor, dim, etp->size(), etp->rank(), ffn});
      }
    }
  }

  void apply(StagedModel& model, const LayoutGroups& groups) override {
    world_ = groups.worldGroup();
    dpSize_ = groups.group(GroupKind::kData)->size();
    auto ep = groups.group(GroupKind::kExpert);
    auto state = std::make_shared<nn::ExpertParallelState>();
    state->ep_group = ep;
    state->ep_rank = ep->rank();
    state->ep_size = ep->size();
    auto etp = groups.group(GroupKind::kExpertTensor);
    state->etp_group = etp;
    state->etp_rank = etp->rank();
    state->etp_size = etp->size();
    auto tp = groups.group(GroupKind::kTensor);
    if (sequenceParallel_ && tp->size() > 1) {
      state->sequence_group = tp;
      state->sequence_shards = tp->size();
    }
    const auto layers = model.moeLayers();
    const int64_t experts = model.numExperts();
    // Sized by the whole model (not the layers this stage built): every rank
    // reduces the same figures.
    context_ = std::make_shared<nn::MoeStepContext>(model.numBlocks(), experts);
    auto named = model.module().named_parameters();
    for (const auto& [prefix, layer] : layers) {
      for (const auto& relative : nn::MoeLayerImpl::expertParameterNames()) {
        const std::string name = prefix + relative;
        if (etp->size() > 1 && model.placement.of(name).partial_gradient) etpPartial_.push_back(named[name]);
      }
      layer->setExpertParallel(state);
      layer->setStepContext(context_);
    }
    if (ep->size() > 1) model.forward_sync = world_;
    etpGroup_ = etp;
    logger()->debug("expert parallel over {} (expert tensor {}): {} MoE layers, {} of {} experts each", ep->name(),
                    etp->name(), layers.size(), experts / ep->size(), experts);
  }

  // fc2's bias under expert tensor parallelism: member 0 computed its
  // gradient (the others add no bias), every member needs it.
  void finishGradients() override {
    if (!etpPartial_.empty()) allReduceGradients(etpPartial_, *etpGroup_, device_);
  }

  void beginStep(const StepInfo& info) override {
    if (context_) context_->reset();
    globalMicroBatches_ = static_cast<double>(info.micro_batches) * dpSize_;
    // Under device groups the weight is the whole job's count (the groups'
    // gradients are summed); the figures stay this group's.
    jobMicroBatches_ = info.job_micro_batches > 0 ? info.job_micro_batches : globalMicroBatches_;
  }

  // Backward starts from loss_sum * scale / divisor for each micro-batch;
  // the auxiliary losses are per micro-batch means, weighted as Megatron
  // weighs them (1 / micro-batches, times the data-parallel average).
  void beforeMicroBatches(double lossScale) override {
    if (context_) context_->aux_gradient_scale = lossScale / std::max(1.0, jobMicroBatches_);
  }

  void afterStep(const StepResult&) override {
    if (!context_) return;
    const nn::MoeStepContext& c = *context_;
    // One reduction: the per-layer counts, which layers ran, then the scalars.
    std::vector<double> flat = c.tokens_per_expert;
    flat.insert(flat.end(), c.layer_ran.begin(), c.layer_ran.end());
    for (double v : {c.aux_loss, c.z_loss, c.routed, c.dropped, c.a2a_bytes, c.a2a_bytes_uniform, c.a2a_seconds}) {
      flat.push_back(v);
    }
    at::Tensor sums = torch::tensor(flat, torch::kFloat64);
    if (world_ && world_->size() > 1) {
      at::Tensor onDevice = sums.to(device_);
      world_->allreduce(onDevice)->wait();
      sums = onDevice.cpu();
    }
    const double* s = sums.data_ptr<double>();
    const size_t counts = c.tokens_per_expert.size(), layers = c.layer_ran.size();
    std::vector<double> perExpert;
    for (size_t l = 0; l < layers; ++l) {
      if (s[counts + l] <= 0) continue;
      for (int64_t e = 0; e < c.num_experts; ++e) perExpert.push_back(s[l * c.num_experts + e]);
    }
    const double* scalars = s + counts + layers;
    stats_.clear();
    const double mb = std::max(1.0, globalMicroBatches_);
    stats_["moe_aux_loss"] = scalars[0] / mb;
    stats_["moe_z_loss"] = scalars[1] / mb;
    stats_["moe_dropped_fraction"] = scalars[2] > 0 ? scalars[3] / scalars[2] : 0;
    stats_["moe_a2a_bytes"] = scalars[4];
    stats_["moe_a2a_bytes_uniform"] = scalars[5];
    stats_["moe_a2a_s"] = scalars[6];
    if (!perExpert.empty()) {
      double lo = perExpert[0], hi = perExpert[0], mean = 0;
      for (double v : perExpert) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        mean += v;
      }
      mean /= static_cast<double>(perExpert.size());
      double var = 0;
      for (double v : perExpert) var += (v - mean) * (v - mean);
      var /= static_cast<double>(perExpert.size());
      stats_["moe_tokens_min"] = lo;
      stats_["moe_tokens_max"] = hi;
      stats_["moe_tokens_cv"] = mean > 0 ? std::sqrt(var) / mean : 0;
    }
  }

  std::map<std::string, double> stepStats() const override { return stats_; }

 private:
  at::Device device_;  // where the world's collectives run (NCCL takes CUDA tensors only)
  bool sequenceParallel_ = false;
  std::shared_ptr<ProcessGroup> world_;
  std::shared_ptr<ProcessGroup> etpGroup_;
  std::vector<at::Tensor> etpPartial_;  // fc2 biases under etp > 1: gradients summed over etp
  int dpSize_ = 1;
  double globalMicroBatches_ = 1;  // the step's micro-batches over the data-parallel ranks
  double jobMicroBatches_ = 1;     // ... and over every device group
  std::shared_ptr<nn::MoeStepContext> context_;
  std::map<std::string, double> stats_;
};

}  // namespace

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kParallel, "expert", "0.1.0", ExpertParallel)

// StagedModel: what a trainer's model exposes so that the engine and the
// parallel plugins can run and split it without knowing what it computes.
//
// A model is a sequence: embed (first stage) -> blocks 0..n-1 -> head and loss
// (last stage). The pipeline plugin gives each stage a contiguous run of
// blocks, and the stage builds only those (ModelBuild); the tensor plugin
// shards the ptrain::nn parallel layers the model is built from
// (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding); the data
// plugin reduces gradients. Each plugin records what it did to a parameter in
// `placement`. With no parallelism the engine simply calls embed, every
// block, then head.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "ptrain/engine/batch.h"
#include "ptrain/engine/placement.h"
#include "ptrain/nn/parameter_init.h"

namespace ptrain {

class ProcessGroup;

namespace nn {
class MoeLayerImpl;
class ParallelLayer;
struct TensorParallelState;
}  // namespace nn

// The loss of one micro-batch as a sum over the items it counts (e.g. answer
// tokens) and that count. The engine divides by the count of the whole global
// batch, so every split of the batch (micro-batches, data-parallel ranks)
// yields the same gradient as one rank would.
struct LossOutput {
  at::Tensor loss_sum;  // scalar, differentiable
  double count = 0;     // items in loss_sum
};

// What a model tells the tensor plugin about itself (docs/tensor_parallel.md).
struct TensorParallelPlan {
  // The ptrain::nn parallel layers the model is built from, each with its
  // parameter-name prefix (e.g. "blocks.0.attn.qkv."). Owned by the model.
  std::vector<std::pair<std::string, nn::ParallelLayer*>> layers;
  // Replicated parameters outside those layers whose gradient is a partial
  // sum on each rank under sequence parallelism, because they act on the
  // sequence shards only (LayerNorm weights and biases). The plugin
  // all-reduces their gradients over the tensor-parallel group.
  std::vector<std::string> sequence_parallel_params;
};

// Which parts of a model one rank builds. A pipeline stage builds only its
// own blocks, plus the embedding on the first stage and the head on the last
// (the runtime asks the pipeline plugin, ParallelPlugin::planBuild). A model
// draws every parameter's initial values from a stream of its own (seeded by
// the model's seed and the parameter's name), so a parameter starts from the
// same values whichever other parts a rank builds.
struct PTRAIN_API ModelBuild {
  // Blocks to build, ascending; nullopt: every block.
  std::optional<std::vector<int>> blocks;
  bool embed = true;  // the parts before the blocks (embedPrefixes)
  bool head = true;   // the parts after them (headPrefixes)

  bool buildsBlock(int index) const;
  bool whole() const { return !blocks && embed && head; }
  // Nothing at all: an outline that still answers numBlocks(), blockPrefix()
  // and blockCost(), for planning before the real build.
  static ModelBuild outline();
};

class StagedModel;

// How a pipeline-split model runs inference across its stages (set on the
// model by the pipeline plugin). Every rank of the pipeline group calls these
// together, in the same order, with tensors of the same shapes.
class PTRAIN_API PipelineInference {
 public:
  virtual ~PipelineInference();
  virtual bool isFirstStage() const = 0;  // runs embed
  virtual bool isLastStage() const = 0;   // runs head
  // `embedded` (first stage; undefined elsewhere) through every block of the
  // model, stage after stage. Returns the head's input on the last stage and
  // an undefined tensor on the others. No gradient.
  virtual at::Tensor forwardBlocks(StagedModel& model, const at::Tensor& embedded) = 0;
  // In place: every stage ends with the last stage's `tensor`.
  virtual void broadcastFromLastStage(at::Tensor& tensor) = 0;
};

class PTRAIN_API StagedModel {
 public:
  virtual ~StagedModel();

  // Owns every parameter, named hierarchically (e.g. "blocks.3.mlp.fc1.weight").
  virtual torch::nn::Module& module() = 0;

  // Blocks of the whole model, built here or not.
  virtual int numBlocks() const = 0;
  // What block i costs to hold, for balancing pipeline stages: its parameter
  // count. Must work on an outline (ModelBuild::outline()); the default counts
  // the built block's parameters, so models built in parts override it.
  virtual int64_t blockCost(int index);
  // Parameter-name prefix of block i (e.g. "blocks.3."), of the parts before
  // the blocks ("embed.") and after them ("head."). Used to place parameters
  // on pipeline stages and to tell norms and biases from weights.
  virtual std::string blockPrefix(int index) const = 0;
  virtual std::vector<std::string> embedPrefixes() const = 0;
  virtual std::vector<std::string> headPrefixes() const = 0;

  // First stage: inputs of a micro-batch -> hidden states. Every micro-batch
  // of a step has the same shape (the engine cuts equal slices of one global
  // batch), and so do the hidden states: a pipeline sends the shape once per
  // step.
  virtual at::Tensor embed(const Batch& micro) = 0;
  // One block: hidden -> hidden (same shape). Only blocks this rank built.
  // The engine and plugins call forwardBlock, which adds the runtime's hooks.
  virtual at::Tensor runBlock(int index, const at::Tensor& hidden) = 0;
  // Last stage: hidden -> loss over the micro-batch's targets.
  virtual LossOutput head(const at::Tensor& hidden, const Batch& micro) = 0;

  // Parameters of the parts before the blocks that the head uses too (a
  // tied output embedding): a pipeline keeps a copy on the last stage and sums
  // their gradients across the two stages. Default: none.
  virtual std::vector<std::string> headSharedParameters() const { return {}; }

  // Whole model: embed, every block, head. Without a pipeline this is the
  // training forward pass. With one (`pipeline` set) it is for inference
  // only: the stages pass the activations on, and every stage returns the
  // last stage's loss (as a float64 scalar without gradient).
  LossOutput forward(const Batch& micro);
  // Inference helpers that work with or without a pipeline: the hidden
  // states entering the head (undefined on stages that do not hold the head),
  // whether this rank holds the head, and a copy of a head-side result
  // (e.g. the next tokens) on every stage.
  at::Tensor forwardHidden(const Batch& micro);
  bool holdsHead() const { return !pipeline || pipeline->isLastStage(); }
  void shareFromHead(at::Tensor& tensor);

  // Block `index` on `hidden` through the wrapper the runtime installed (its
  // hooks: offload, recomputation, ...), or runBlock when there is none.
  // Training, evaluation and pipelines run blocks through this.
  at::Tensor forwardBlock(int index, const at::Tensor& hidden);
  // Set by the runtime that owns the model.
  std::function<at::Tensor(int index, const at::Tensor& hidden)> block_wrapper;

  // Named parameters this rank holds (placement.held), in module order.
  std::vector<std::pair<std::string, at::Tensor>> localParameters();

  // How parameter `name`, of whole sizes `fullSizes`, starts
  // (nn/parameter_init.h): the rule any block of it is drawn from alone.
  // nullopt: the model has no rule for it. The default has none; a model
  // built from ptrain::nn parallel layers gives one for every parameter, so
  // that a runtime can build it under nn::DeferredInit (each rank allocating
  // and drawing only its slice); `ptrain check` refuses a layout that splits
  // a parameter without one.
  virtual std::optional<nn::ParameterInit> parameterInit(const std::string& name,
                                                         const std::vector<int64_t>& fullSizes) const {
    return std::nullopt;
  }
  // Fills every parameter that has storage, whole, from parameterInit, and
  // leaves deferred ones (nn::isDeferred) to materialiseParameters. A model
  // calls it at the end of its constructor. Throws InternalError naming a
  // parameter without a rule.
  void initialiseParameters();
  // Gives every deferred parameter storage for the block placement says this
  // rank holds: allocated as float32 on the host, filled from parameterInit
  // (the values the whole tensor has there), then moved to `device`; the
  // parameter object stays the same (set_data). Returns the bytes allocated.
  // Called by the runtime after the parallel plugins' shard(). Throws
  // ConfigError naming a deferred parameter without a rule.
  int64_t materialiseParameters(at::Device device);
  // Names of the parameters still deferred, in module order.
  std::vector<std::string> deferredParameters();

  // Tensor parallelism, driven by the tensor plugin (ptrain::nn::
  // applyTensorParallel): it asks for the plan, shards the parameters of the
  // plan's layers, gives each layer the state, then calls setTensorParallel
  // so that the model's own code (embedding, loss, decoding, the sequence-
  // parallel regions between layers) follows. Called once, right after the
  // model is built, on the thread that runs it. The model keeps `state`.
  // Both default to throwing ConfigError "this model does not support tensor
  // parallelism"; a model that overrides one overrides both.
  virtual TensorParallelPlan tensorParallelPlan();
  virtual void setTensorParallel(std::shared_ptr<const nn::TensorParallelState> state);

  // Mixture of experts: the experts of each MoE layer, 0 for a dense model
  // (asked of an outline too, so it must not depend on what was built), and
  // the MoE layers this rank built, each with its parameter-name prefix
  // ("blocks.3.moe."). The runtime adds the expert plugin for a model with
  // experts, whatever ep.
  virtual int64_t numExperts() const { return 0; }
  virtual std::vector<std::pair<std::string, nn::MoeLayerImpl*>> moeLayers() { return {}; }

  // When set (by the expert plugin, under expert parallelism), ranks of this
  // group exchange data inside every forward pass: inference code that may
  // run a different number of forward passes on different ranks (decoding
  // until every sequence stops) must keep them in step over it.
  std::shared_ptr<ProcessGroup> forward_sync;

  // How each parameter is split, reduced, owned and mirrored across ranks,
  // as the parallel plugins set it up (engine/placement.h).
  Placement placement;
  // Pipeline parallelism (set by the pipeline plugin; null without it).
  std::shared_ptr<PipelineInference> pipeline;
};

// Why `model` cannot build only a rank's slice of what tensor parallelism
// (tp > 1) or expert parallelism (ep or etp > 1) splits, or nullopt when it
// can. `model` must be built whole under nn::DeferredInit, as a runtime builds
// it: a parameter that a plan splits must then have no storage yet
// (nn::isDeferred) and an initial-value rule (StagedModel::parameterInit),
// else every rank would hold the whole tensor. The first problem, naming the
// parameter; a model without tensor parallelism says so.
PTRAIN_API std::optional<std::string> checkShardedBuild(StagedModel& model, int64_t tp, int64_t ep, int64_t etp);

}  // namespace ptrain

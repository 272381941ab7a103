#include "ptrain/engine/runtime.h"
#include "ptrain/engine/weights_source.h"

#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <set>

#include "ptrain/comm/communicator.h"
#include "ptrain/core/host_allocator.h"
#include "ptrain/core/logging.h"
#include "ptrain/core/phase_timer.h"
#include "ptrain/core/resources.h"
#include "ptrain/engine/cross_group_gradients.h"
#include "ptrain/engine/distributed_optimizer.h"
#include "ptrain/engine/parallel.h"
#include "ptrain/engine/parallel_plugins.h"
#include "ptrain/engine/precision.h"
#include "ptrain/engine/trainer.h"
#include "ptrain/layout/device_groups.h"
#include "ptrain/layout/validation.h"
#include "ptrain/nn/deferred_init.h"
#include "ptrain/nn/recompute.h"
#include "ptrain/plugin/registry.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain {
namespace {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Identity in the forward pass; its backward calls `onBackward` when the
// gradient passes through. The runtime puts one on a block's output
// (beforeBlockBackward) and one on its input (afterBlockBackward).
struct BlockEdge : public torch::autograd::Function<BlockEdge> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const std::function<void()>* onBackward) {
    ctx->saved_data["hook"] = reinterpret_cast<int64_t>(onBackward);
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* onBackward = reinterpret_cast<const std::function<void()>*>(ctx->saved_data["hook"].toInt());
    (*onBackward)();
    return {grads[0], at::Tensor()};
  }
};

// model.recompute: full. The blocks in `blocks` keep only their input; their
// forward runs again in backward (nn::recomputed). Added after every other
// hook, so it wraps the block alone.
class BlockRecompute final : public StepHooks {
 public:
  explicit BlockRecompute(std::set<int> blocks) : blocks_(std::move(blocks)) {}

  at::Tensor runBlock(int index, const at::Tensor& input, const BlockRunner& next) override {
    if (blocks_.count(index) == 0 || !torch::GradMode::is_enabled()) return next(input);
    // Backward must reach the recomputation even when the input has no
    // gradient of its own (a frozen embedding): the parameters inside do.
    at::Tensor in = input.requires_grad() ? input : input.detach().requires_grad_(true);
    return nn::recomputed([next](const std::vector<at::Tensor>& x) { return next(x[0]); }, {in});
  }

 private:
  std::set<int> blocks_;
};

// The block of the whole parameter this rank's tensor `local` is.
TensorBlock blockOf(const ParameterPlacement& where, const at::Tensor& local) {
  TensorBlock b;
  b.offsets = where.offsets(local.sizes());
  b.sizes = local.sizes().vec();
  return b;
}

// A distributed optimizer's range: elements [begin, end) of the parameter's
// block on this rank.
TensorBlock pieceBlock(const ParameterPlacement& where, const DistributedOptimizer::Piece& piece) {
  TensorBlock block;
  block.offsets = where.offsets(piece.param_sizes);
  block.sizes = piece.param_sizes;
  block.flat_begin = piece.begin;
  block.flat_end = piece.end;
  return block;
}

// An optimizer state tensor of a parameter: shaped like the parameter's
// tensor on this rank, or cut along its first dimensions only (a row-wise
// optimizer's per-row sums). Split along each dimension the parameter is
// split along; `full` receives its whole sizes.
TensorBlock stateBlock(const std::string& name, const ParameterPlacement& where, const at::Tensor& state,
                       const at::Tensor& param, std::vector<int64_t>* full) {
  TensorBlock b;
  b.sizes = state.sizes().vec();
  b.offsets.assign(b.sizes.size(), 0);
  *full = b.sizes;
  for (const ShardSpec& spec : where.shards) {
    const auto d = static_cast<size_t>(spec.dim);
    PTRAIN_CHECK(spec.dim < state.dim() && state.size(spec.dim) == param.size(spec.dim), "optimizer state '", name,
                 "' of shape ", state.sizes(), " does not follow its parameter's split along dimension ", spec.dim);
    b.offsets[d] = spec.index * state.size(spec.dim);
    (*full)[d] = spec.full_size;
  }
  return b;
}

// Optimizer-file entries of the precision plugin's state.
constexpr const char* kPrecisionPrefix = "precision.";

// "<slot>.<param>" -> "<param>".
std::string parameterOfState(const std::string& stateName) { return stateName.substr(stateName.find('.') + 1); }

std::string shapeString(at::IntArrayRef sizes) {
  std::ostringstream os;
  os << sizes;
  return os.str();
}

// Restores train mode on every exit path of an inference.
struct TrainModeAgain {
  torch::nn::Module& module;
  ~TrainModeAgain() { module.train(); }
};

}  // namespace

ModelRuntime::ModelRuntime(Communicator& comm, PluginRegistry& registry, const ModelFactory& factory,
                           RuntimeOptions options)
    : comm_(comm), options_(std::move(options)) {
  PTRAIN_CHECK(factory != nullptr, "runtime '", options_.name, "': no model factory");
  groups_ = comm_.groupsFor(options_.layout);

  PluginContext ctx;
  ctx.logger = logger();
  ctx.recipe = options_.recipe;
  ctx.rank = comm_.rank();
  ctx.world_size = comm_.worldSize();
  ctx.device = options_.device;
  // Which parts this rank builds: asked of an outline, before any weight
  // exists. The outline also says whether the model has experts: the expert
  // plugin places them (and keeps their figures) at any ep.
  std::shared_ptr<StagedModel> outline = factory(ModelBuild::outline());
  const bool experts = outline->numExperts() > 0;
  // The expert tensor size defaults to tp whether or not the model has
  // experts; it matters only to a model with experts.
  LayoutSizes sizes = options_.layout.sizes();
  if (!experts) sizes.ep = sizes.etp = 1;
  const bool distributedOptimizer = options_.optimizer && options_.optimizer->distributed;
  const ParallelPluginPick pick = pickParallelPlugins(sizes, experts, registry);
  PTRAIN_CHECK_AS(ConfigError, pick.missing.empty(), "runtime '", options_.name,
                  "': no installed parallel plugin executes ", pick.missing.front());
  for (const auto& name : pick.plugins) {
    // The distributed optimizer reduces (reduce-scatters) the gradients over
    // the data-parallel groups itself: the plugin that executes dp alone is
    // left out.
    if (distributedOptimizer) {
      const PluginInfo* info = nullptr;
      for (const auto& p : registry.plugins())
        if (p.kind == plugin_kind::kParallel && p.name == name) info = &p;
      if (info != nullptr && info->executes == std::vector<std::string>{"dp"}) continue;
    }
    pluginObjects_.push_back(registry.create(plugin_kind::kParallel, name, ctx, "parallel"));
    parallel_.push_back(static_cast<ParallelPlugin*>(pluginObjects_.back().get()));
  }
  ModelBuild build;
  for (auto* p : parallel_) p->planBuild(*outline, *groups_, build);
  outline.reset();
  torch::manual_seed(options_.seed);
  {
    // The parameters a plugin may split come without storage: each plugin
    // narrows them to this rank's slice (shard), then only the slices are
    // allocated and drawn, so no rank ever holds a whole split tensor.
    nn::DeferredInit deferred;
    model_ = factory(build);
  }
  PTRAIN_CHECK(model_ != nullptr, "runtime '", options_.name, "': the model factory returned nothing");
  const std::vector<std::string> deferredNames = model_->deferredParameters();
  for (auto* p : parallel_) p->shard(*model_, *groups_);
  const std::set<std::string> deferredSet(deferredNames.begin(), deferredNames.end());
  for (const auto& name : model_->placement.names()) {
    PTRAIN_CHECK_AS(ConfigError, !model_->placement.sharded(name) || deferredSet.count(name) != 0,
                    "model: parameter '", name, "' is split over ranks, but its layer built it whole (with storage), "
                    "so every rank would hold all of it; build it from ptrain::nn layers, or register it with "
                    "nn::splittableParameter (nn/deferred_init.h)");
  }
  model_->materialiseParameters(options_.device);
  if (options_.device != at::Device(at::kCPU)) model_->module().to(options_.device);
  model_->module().train();
  pluginObjects_.push_back(registry.create(plugin_kind::kPrecision, options_.precision, ctx, "precision.name"));
  precision_ = static_cast<PrecisionPlugin*>(pluginObjects_.back().get());
  // Before the parallel plugins: they hook each parameter's gradient
  // accumulator, which a change of dtype replaces.
  precision_->castModel(*model_);
  // What the build drew depends on the parts this rank built; what comes
  // next (dropout) must not.
  torch::manual_seed(options_.seed + 1);
  for (auto* p : parallel_) p->apply(*model_, *groups_);
  precision_->attach(*model_, *groups_, options_.optimizer.has_value());

  // The precision plugin first: its beginStep gives every parameter its
  // float32 gradient before anything else runs, and its finishGradients (run
  // in reverse order) sees the gradients every other hook has reduced.
  hooks_.push_back(precision_);
  for (auto* p : parallel_) hooks_.push_back(p);
  for (auto* h : hooks_) observeBlocks_ = observeBlocks_ || h->observesBlockBackward();
  model_->block_wrapper = [this](int index, const at::Tensor& input) { return runBlock(index, input); };
  // The backward events of each block, called from autograd nodes that point
  // at them (so they live as long as the runtime).
  for (int b = 0; b < model_->numBlocks(); ++b) {
    auto before = [this, b] {
      for (auto* h : hooks_)
        if (h->observesBlockBackward()) h->beforeBlockBackward(b);
    };
    auto after = [this, b] {
      for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it)
        if ((*it)->observesBlockBackward()) (*it)->afterBlockBackward(b);
    };
    blockEvents_.emplace_back(before, after);
  }

  if (options_.recompute == "full") {
    std::vector<int> mine;
    for (int b = 0; b < model_->numBlocks(); ++b)
      if (build.buildsBlock(b)) mine.push_back(b);
    const size_t count = options_.recompute_num_layers > 0
                             ? std::min(mine.size(), static_cast<size_t>(options_.recompute_num_layers))
                             : mine.size();
    addHooks(std::make_shared<BlockRecompute>(std::set<int>(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(count))));
  }

  // Before the optimizer: the parameters' memory is free again when it
  // allocates its state.
  OffloadPlugin* offload = nullptr;
  if (options_.offload.any()) {
    pluginObjects_.push_back(registry.create(plugin_kind::kOffload, options_.offload.plugin, ctx, "offload.name"));
    offload = static_cast<OffloadPlugin*>(pluginObjects_.back().get());
    offload->attachModel(*model_, options_.offload);
    // The innermost block hook: inside a recomputation, around the block alone.
    hooks_.push_back(offload);
    observeBlocks_ = observeBlocks_ || offload->observesBlockBackward();
  }

  if (options_.optimizer) {
    OptimizerOptions optimizerOptions = *options_.optimizer;
    optimizerOptions.master_weights = optimizerOptions.master_weights || precision_->masterWeights();
    if (distributedOptimizer) {
      const int64_t bucketBytes =
          options_.recipe ? static_cast<int64_t>(options_.recipe->getFloat("parallel.grad_bucket_size_mb") * (1 << 20))
                          : int64_t{16} << 20;
      const bool overlap = options_.recipe ? options_.recipe->getBool("parallel.overlap_grad_reduce") : true;
      // Offloaded gradients rest in the offload tier, not in the buffer.
      const bool gradientViews = !options_.offload.grads && !options_.offload.params;
      // Device groups sum whole gradients across the groups (below) before
      // the optimizer steps on its range: the buckets are all-reduced inside
      // the group, and the parameters' gradients must be views of them.
      distributed_ = std::make_shared<DistributedOptimizer>(model_->localParameters(), optimizerOptions,
                                                            model_->placement, *groups_, bucketBytes, overlap,
                                                            gradientViews, options_.device_groups.has_value());
      optimizer_ = &distributed_->local();
      countedInNorm_ = distributed_->countedInNorm();
      // Right after the precision plugin: its finishGradients (hooks unwind
      // in reverse) reduce-scatters what every parallel plugin has completed.
      hooks_.insert(hooks_.begin() + 1, distributed_.get());
      // Its all-gathers run on into the next forward pass: each block waits
      // for the ranges of its own parameters (outermost of the block hooks
      // but the precision plugin's, so before an offload or parallel plugin
      // touches them), the step's start for the rest.
      std::vector<std::pair<int, std::string>> prefixes;
      for (int b = 0; b < model_->numBlocks(); ++b)
        if (build.buildsBlock(b)) prefixes.emplace_back(b, model_->blockPrefix(b));
      distributed_->gatherDuringNextForward([prefixes](const std::string& name) {
        for (const auto& [b, prefix] : prefixes)
          if (name.compare(0, prefix.size(), prefix) == 0) return b;
        return -1;
      });
    } else {
      ownOptimizer_ = makeOptimizer(model_->localParameters(), optimizerOptions);
      optimizer_ = ownOptimizer_.get();
      for (const auto& name : optimizer_->parameterNames()) {
        countedInNorm_.push_back(model_->placement.countedInNorm(name, options_.layout, comm_.rank()));
      }
    }
  }

  if (offload != nullptr && optimizer_ != nullptr) offload->attachOptimizer(*optimizer_);

  if (options_.device_groups && optimizer_ != nullptr) {
    const auto& run = *options_.device_groups;
    std::vector<CrossGroupGradients::Held> held;
    for (auto& [name, p] : model_->localParameters()) {
      if (!p.requires_grad()) continue;
      const ParameterPlacement& where = model_->placement.of(name);
      held.push_back(CrossGroupGradients::Held{name, p, where.fullSizes(p.sizes()), where.offsets(p.sizes()),
                                               where.row_sparse_gradient});
    }
    crossGroup_ =
        std::make_shared<CrossGroupGradients>(std::move(held), *run.groups, run.group, run.job, options_.device);
    // Right after the precision plugin: its finishGradients (hooks unwind in
    // reverse) comes after the sum, every parallel plugin's and the
    // distributed optimizer's (its whole-sum all-reduces) before it.
    hooks_.insert(hooks_.begin() + 1, crossGroup_.get());
  }
}

ModelRuntime::~ModelRuntime() {
  // The model may outlive the runtime (sharedModel()): it must not call back,
  // and holds the last step's values.
  try {
    awaitParameters();
  } catch (const std::exception&) {
    // A failed group already said why; a destructor must not throw.
  }
  if (model_) model_->block_wrapper = nullptr;
}

StagedModel& ModelRuntime::model() {
  awaitParameters();
  return *model_;
}

std::shared_ptr<StagedModel> ModelRuntime::sharedModel() {
  awaitParameters();
  return model_;
}

void ModelRuntime::awaitParameters() {
  if (distributed_) distributed_->awaitParameters();
}

void ModelRuntime::addHooks(std::shared_ptr<StepHooks> hooks) {
  PTRAIN_CHECK(hooks != nullptr, "runtime '", options_.name, "': null hooks");
  hooks_.push_back(hooks.get());
  observeBlocks_ = observeBlocks_ || hooks->observesBlockBackward();
  extraHooks_.push_back(std::move(hooks));
}

std::pair<int64_t, int64_t> ModelRuntime::dataRows(int64_t rows) const {
  auto dpGroup = groups_->group(GroupKind::kData);
  const int64_t dp = dpGroup->size();
  if (options_.device_groups) {
    // The group's rows of the global batch, then an even split over its
    // data-parallel ranks.
    const auto& run = *options_.device_groups;
    const auto ranges = run.groups->rows(rows);
    PTRAIN_CHECK_AS(ConfigError, ranges.has_value(), "a global batch of ", rows,
                    " rows does not split by the device groups' shares");
    const auto [first, last] = (*ranges)[static_cast<size_t>(run.group)];
    const auto split = dataParallelRows(last - first, dp, {});
    PTRAIN_CHECK_AS(ConfigError, split.has_value(), "device group ", (*run.groups)[run.group].name, "'s ",
                    last - first, " rows do not split over its ", dp, " data-parallel ranks");
    const int64_t begin = first + dpGroup->rank() * (*split)[0];
    return {begin, begin + (*split)[0]};
  }
  // Uneven shares need no other care: every micro-batch's loss is divided by
  // the count of the whole global batch, so the sum over ranks is the
  // single-rank gradient whatever each rank took.
  const auto split = dataParallelRows(rows, dp, options_.data_parallel_shares);
  PTRAIN_CHECK_AS(ConfigError, split.has_value(), "a global batch of ", rows, " rows does not split over ", dp,
                  " data-parallel ranks", options_.data_parallel_shares.empty() ? "" : " by the given shares");
  int64_t begin = 0;
  for (int64_t r = 0; r < dpGroup->rank(); ++r) begin += (*split)[static_cast<size_t>(r)];
  return {begin, begin + (*split)[static_cast<size_t>(dpGroup->rank())]};
}

std::vector<Batch> ModelRuntime::cutMicroBatches(const Batch& rows, int64_t microBatchSize) const {
  const int64_t local = rows.size();
  const int64_t micro = microBatchSize > 0 ? microBatchSize : local;
  PTRAIN_CHECK_AS(ConfigError, micro > 0 && local % micro == 0, "a data-parallel share of ", local,
                  " rows does not split into micro-batches of ", micro);
  std::vector<Batch> out;
  for (int64_t m = 0; m < local / micro; ++m) out.push_back(rows.slice(m * micro, (m + 1) * micro).to(device()));
  return out;
}

std::vector<Batch> ModelRuntime::microBatches(const Batch& globalBatch, int64_t microBatchSize) const {
  const auto [begin, end] = dataRows(globalBatch.size());
  return cutMicroBatches(globalBatch.slice(begin, end), microBatchSize);
}

std::vector<double> ModelRuntime::sumOverDataParallel(const std::vector<double>& values) const {
  if (options_.device_groups && !values.empty()) {
    // Every data-parallel replica of every group once: its first model-parallel rank.
    at::Tensor t = torch::tensor(values, torch::kFloat64).to(device());
    if (groups_->indexIn(GroupKind::kModel) != 0) t.zero_();
    options_.device_groups->job->allreduce(t)->wait();
    const at::Tensor host = t.cpu();
    return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
  }
  auto dpGroup = groups_->group(GroupKind::kData);
  if (dpGroup->size() == 1 || values.empty()) return values;
  at::Tensor t = torch::tensor(values, torch::kFloat64).to(device());
  dpGroup->allreduce(t)->wait();
  const at::Tensor host = t.cpu();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

at::Tensor ModelRuntime::assembleRows(const at::Tensor& mine, int64_t rows) const {
  const auto [begin, end] = dataRows(rows);
  PTRAIN_CHECK(mine.dim() >= 1 && mine.size(0) == end - begin, "runtime '", options_.name, "': assembleRows got ",
               mine.sizes(), " for rows [", begin, ", ", end, ")");
  auto dpGroup = groups_->group(GroupKind::kData);
  if (!options_.device_groups && dpGroup->size() == 1) return mine.to(device());
  std::vector<int64_t> shape = mine.sizes().vec();
  shape[0] = rows;
  at::Tensor all = torch::zeros(shape, mine.options().device(device()));
  // Over the job every model-parallel rank of a replica holds the same
  // block: the first one's counts. Inside one layout the data-parallel
  // group has one rank of each replica already.
  if (!options_.device_groups || groups_->indexIn(GroupKind::kModel) == 0) {
    all.narrow(0, begin, end - begin).copy_(mine);
  }
  ProcessGroup& over = options_.device_groups ? *options_.device_groups->job : *dpGroup;
  over.allreduce(all)->wait();
  return all;
}

at::Tensor ModelRuntime::runBlock(int index, const at::Tensor& input) {
  BlockRunner next = [this, index](const at::Tensor& x) { return model_->runBlock(index, x); };
  // The first hook ends up outermost.
  for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) {
    StepHooks* hook = *it;
    next = [hook, index, inner = std::move(next)](const at::Tensor& x) { return hook->runBlock(index, x, inner); };
  }
  if (!observeBlocks_ || !torch::GradMode::is_enabled()) return next(input);

  // An input without gradient (a frozen embedding) would never report that
  // backward passed it: give it a gradient of its own, which nothing reads.
  at::Tensor in = input.requires_grad() ? input : input.detach().requires_grad_(true);
  in = BlockEdge::apply(in, &blockEvents_[static_cast<size_t>(index)].second);
  return BlockEdge::apply(next(in), &blockEvents_[static_cast<size_t>(index)].first);
}

LossOutput ModelRuntime::runLoss(const StepInput& input, const at::Tensor& hidden, const Batch& micro) {
  return input.loss ? input.loss(*model_, hidden, micro) : model_->head(hidden, micro);
}

StepResult ModelRuntime::step(const StepInput& input) {
  PTRAIN_CHECK(optimizer_ != nullptr, "runtime '", options_.name,
               "' has no optimizer: it was built for inference only, so it cannot take a training step");
  const auto& micro = input.micro_batches;
  const int count = static_cast<int>(micro.size());
  PTRAIN_CHECK(count > 0, "runtime '", options_.name, "': a step needs at least one micro-batch");
  // Whatever no inner scope claims (the pipeline's waits, the reductions,
  // the update) is the passes themselves.
  PhaseScope passes(Phase::kForwardBackward);
  auto dpGroup = groups_->group(GroupKind::kData);
  auto ppGroup = groups_->group(GroupKind::kPipeline);
  // Under pipeline parallelism every stage draws its own dropout masks, from
  // a stream fixed by the seed, the step and the stage (so a resumed run
  // draws the same ones).
  if (ppGroup->size() > 1) {
    torch::manual_seed(options_.seed * 1000003ULL + static_cast<uint64_t>(input.step) * 1009ULL +
                       static_cast<uint64_t>(ppGroup->rank()));
  }
  StepInfo info{input.step, count, 0};
  if (options_.device_groups) {
    // Every data-parallel replica's count once, over the job.
    info.job_micro_batches = sumOverDataParallel({static_cast<double>(count)}).front();
  }
  for (auto* h : hooks_) h->beginStep(info);
  double lossScale = 1;
  for (auto* h : hooks_) lossScale *= h->lossScale();
  for (auto* h : hooks_) h->beforeMicroBatches(lossScale);

  MicroBatchRun run;
  run.model = model_.get();
  run.micro_batches = &micro;
  run.run_block = [this](int index, const at::Tensor& x) { return model_->forwardBlock(index, x); };
  run.loss = [&](const at::Tensor& hidden, const Batch& batch) { return runLoss(input, hidden, batch); };
  run.loss_divisor = input.loss_divisor;
  run.loss_scale = lossScale;
  run.before_backward = [this](int index, int total) {
    for (auto* h : hooks_) h->beforeBackward(index, total);
  };

  double lossSum = 0;
  bool scheduled = false;
  for (auto* p : parallel_) {
    if (auto sum = p->runMicroBatches(run)) {
      lossSum = *sum;
      scheduled = true;
      break;
    }
  }
  // The first step measures what the first micro-batch's forward pass keeps
  // for backward (on the host, through the caching allocator's count).
  const bool measureActivations =
      !memoryReported_ && device().is_cpu() && cachingHostAllocatorInstalled();
  int64_t activationBytes = -1;
  if (!scheduled) {
    for (int m = 0; m < count; ++m) {
      const Batch& batch = micro[static_cast<size_t>(m)];
      run.before_backward(m, count);
      const int64_t liveBefore = measureActivations && m == 0 ? hostAllocatorStats().live_bytes : 0;
      at::Tensor hidden = model_->embed(batch);
      for (int b = 0; b < model_->numBlocks(); ++b) hidden = model_->forwardBlock(b, hidden);
      LossOutput out = run.loss(hidden, batch);
      if (measureActivations && m == 0) activationBytes = hostAllocatorStats().live_bytes - liveBefore;
      run.backwardLoss(out.loss_sum).backward();
      lossSum += out.loss_sum.item<double>();
    }
  }
  // Unwound in reverse order: data-parallel sums first, then e.g. the
  // tensor-parallel sums of partial (sequence-parallel) gradients.
  {
    PhaseScope reduce(Phase::kGradReduce);
    for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) (*it)->finishGradients();
  }

  PhaseScope update(Phase::kOptimizer);
  StepResult result;
  result.step = input.step;
  result.loss_scale = lossScale;
  // The loss is known on every rank before the update, so that a non-finite
  // one can keep the parameters as they are.
  at::Tensor lossT = torch::tensor({lossSum}, torch::TensorOptions(torch::kFloat64).device(device()));
  if (dpGroup->size() > 1) dpGroup->allreduce(lossT)->wait();
  // Only the last pipeline stage computes the loss; the others add 0.
  if (ppGroup->size() > 1) ppGroup->allreduce(lossT)->wait();
  if (options_.device_groups) {
    // Each group's total once (from its rank 0), over the job.
    if (comm_.rank() != 0) lossT.zero_();
    options_.device_groups->job->allreduce(lossT)->wait();
  }
  result.loss_sum = lossT.item<double>();
  result.loss = result.loss_sum / input.loss_divisor;
  // Each value is counted by one rank (countedInNorm_), so the world's sum is
  // the model's.
  std::function<void(at::Tensor&)> sumOverWorld;
  if (options_.device_groups) {
    // The groups hold the same gradient: group 0's norm, for every group
    // (their own sums would differ in the last bits).
    sumOverWorld = [this](at::Tensor& t) {
      if (options_.device_groups->group != 0) t.zero_();
      options_.device_groups->job->allreduce(t)->wait();
    };
  } else if (comm_.worldSize() > 1) {
    sumOverWorld = [this](at::Tensor& t) { comm_.world().allreduce(t)->wait(); };
  }
  const auto& params = optimizer_->parameters();
  result.grad_norm = globalGradNorm(params, sumOverWorld, countedInNorm_, device()) / lossScale;
  result.lr = learningRate(*options_.optimizer, optimizer_->stepCount());
  GradientCheck check{&params, result.grad_norm};
  bool allowed = true;
  for (auto* h : hooks_) allowed = h->mayStep(check) && allowed;
  // A hook that refused (fp16's loss scaler on an overflow) owns that skip.
  // Otherwise no update is made from a non-finite loss or gradient, in any
  // precision: the engine applies train.on_nonfinite to the step. The norm
  // and the loss are the same on every rank, so every rank decides alike.
  if (allowed && (!std::isfinite(result.grad_norm) || !std::isfinite(result.loss))) {
    allowed = false;
    result.nonfinite = true;
  }
  if (allowed) {
    // Clipping and the loss scale are folded into the update: the optimizer
    // scales each gradient as it reads it.
    const double gradScale = clipCoefficient(result.grad_norm, options_.optimizer->clip_grad) / lossScale;
    result.applied = optimizer_->step(result.lr, gradScale);
  }
  if (!memoryReported_) {
    memoryReported_ = true;
    reportMemory(result, activationBytes);
  }
  optimizer_->zeroGrad();
  for (auto* h : hooks_) h->afterStep(result);
  for (auto* h : hooks_)
    for (const auto& [k, v] : h->stepStats()) result.stats[k] = v;
  if (options_.max_memory_mb > 0) {
    const double peak = peakRssMb();
    PTRAIN_CHECK_AS(OutOfMemoryError, peak <= options_.max_memory_mb, "out of memory: rank ", comm_.rank(),
                    " of runtime '", options_.name, "' reached ", static_cast<int64_t>(peak),
                    " MB at step ", input.step + 1, ", over train.max_memory_mb=",
                    static_cast<int64_t>(options_.max_memory_mb),
                    " (`ptrain doctor RUN_DIR` or `ptrain plan` say what to change)");
  }
  return result;
}

namespace {
int64_t bytesOf(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }
}  // namespace

void ModelRuntime::reportMemory(StepResult& result, int64_t activationBytes) {
  int64_t params = 0, grads = 0, states = 0;
  for (const auto& [name, p] : model_->localParameters()) params += bytesOf(p);
  // The distributed optimizer's reduced ranges are views of the gradient
  // buffer (engine/gradient_buffer.h); they add bytes only where the
  // parameters' gradients are not views of it too (offloaded gradients).
  std::set<const void*> storages;
  for (const auto& [name, p] : model_->localParameters()) {
    grads += bytesOf(p.grad());
    if (p.grad().defined()) storages.insert(p.grad().storage().data());
  }
  if (distributed_) {
    for (const auto& p : optimizer_->parameters())
      if (p.grad().defined() && storages.count(p.grad().storage().data()) == 0) grads += bytesOf(p.grad());
    states = distributed_->stateBytes();
  } else {
    for (const auto& [name, t] : optimizer_->state()) states += bytesOf(t);
  }
  result.stats["mem_params"] = static_cast<double>(params);
  result.stats["mem_grads"] = static_cast<double>(grads);
  result.stats["mem_optimizer"] = static_cast<double>(states);
  if (activationBytes >= 0) result.stats["mem_activations"] = static_cast<double>(activationBytes);
}

EvalContext ModelRuntime::evalContext() const {
  auto dpGroup = groups_->group(GroupKind::kData);
  EvalContext ctx;
  ctx.shard = dpGroup->rank();
  ctx.num_shards = dpGroup->size();
  ctx.all_reduce_sum = [dpGroup](at::Tensor& t) { dpGroup->allreduce(t)->wait(); };
  ctx.device = device();
  return ctx;
}

void ModelRuntime::inference(const std::function<void(StagedModel& model, const EvalContext& ctx)>& fn) {
  awaitParameters();
  torch::NoGradGuard noGrad;
  model_->module().eval();
  TrainModeAgain again{model_->module()};
  fn(*model_, evalContext());
}

RankShare ModelRuntime::checkpointShare() {
  awaitParameters();
  torch::NoGradGuard noGrad;
  const Placement& placement = model_->placement;
  const int rank = comm_.rank();
  RankShare share;
  // Device groups hold the same model: group 0 writes it.
  if (options_.device_groups && options_.device_groups->group != 0) return share;
  std::map<std::string, at::Tensor> owned;
  for (auto& [name, t] : model_->localParameters()) {
    // Each value once in the job: mirrors and replicas are another rank's.
    if (placement.mirror(name) || !placement.countedInNorm(name, options_.layout, rank)) continue;
    const ParameterPlacement& where = placement.of(name);
    share.parameters.push_back(ShardedTensor{name, t.detach(), where.fullSizes(t.sizes()), blockOf(where, t)});
    owned.emplace(name, t);
  }
  if (optimizer_ == nullptr) return share;
  if (distributed_) {
    for (auto& piece : distributed_->pieces()) {
      if (!piece.saved_here) continue;
      const ParameterPlacement& where = placement.of(piece.name);
      const TensorBlock block = pieceBlock(where, piece);
      const std::vector<int64_t> full = where.fullSizes(piece.param_sizes);
      for (auto& [slot, t] : piece.slots) share.optimizer.push_back(ShardedTensor{slot + "." + piece.name, t, full, block});
      // As the non-sharded optimizer keeps them: masters of lower precisions only.
      if (piece.param_dtype != at::kFloat) {
        share.optimizer.push_back(ShardedTensor{"master." + piece.name, piece.master, full, block});
      }
    }
  } else {
    for (auto& [name, t] : optimizer_->state()) {
      const std::string param = parameterOfState(name);
      auto it = owned.find(param);
      if (it == owned.end()) continue;
      std::vector<int64_t> full;
      TensorBlock block = stateBlock(name, placement.of(param), t, it->second, &full);
      share.optimizer.push_back(ShardedTensor{name, t.detach(), std::move(full), std::move(block)});
    }
  }
  // The same on every rank: rank 0's.
  if (rank == 0) {
    for (auto& [name, t] : precision_->state()) {
      share.optimizer.push_back(
          ShardedTensor{kPrecisionPrefix + name, t.detach(), t.sizes().vec(), TensorBlock::whole(t.sizes().vec())});
    }
  }
  return share;
}

void ModelRuntime::loadWeights(WeightsSource& weights) {
  awaitParameters();  // nothing in flight may overwrite what is read
  torch::NoGradGuard noGrad;
  const Placement& placement = model_->placement;
  std::map<std::string, at::Tensor> params;
  // `name`'s block into `out`, after checking the source has it whole-shaped
  // as this model does.
  auto read = [&](const std::string& name, const std::vector<int64_t>& full, const TensorBlock& block, at::Tensor out) {
    auto info = weights.find(name);
    if (!info) {
      throw CheckpointError(detail::concat(weights.where(), ": no parameter '", name,
                                           "': the weights are of another model (its names: ", weights.names().size(),
                                           " tensors, e.g. '", weights.names().empty() ? "" : weights.names().front(),
                                           "')"));
    }
    if (info->shape != full) {
      throw CheckpointError(detail::concat(weights.where(), ": parameter '", name, "' has shape ",
                                           shapeString(info->shape), ", this model has ", shapeString(full),
                                           ": the weights are of another model"));
    }
    weights.read(name, block, out);
  };
  for (auto& item : model_->module().named_parameters()) {
    const std::string& name = item.key();
    if (!placement.held(name)) continue;  // another pipeline stage's
    at::Tensor p = item.value().detach();
    params.emplace(name, p);
    const ParameterPlacement& where = placement.of(name);
    read(name, where.fullSizes(p.sizes()), blockOf(where, p), p);
  }
  if (optimizer_ == nullptr) return;
  // The float32 masters the optimizer made from the initial weights: read
  // from the source too (not copied from a lower-precision parameter), so
  // the first update starts from the loaded values at full precision.
  if (distributed_) {
    for (auto& piece : distributed_->pieces()) {
      const ParameterPlacement& where = placement.of(piece.name);
      read(piece.name, where.fullSizes(piece.param_sizes), pieceBlock(where, piece), piece.master);
    }
    return;
  }
  for (auto& [name, t] : optimizer_->state()) {
    if (name.rfind("master.", 0) != 0) continue;
    const std::string param = parameterOfState(name);
    std::vector<int64_t> full;
    const TensorBlock block = stateBlock(name, placement.of(param), t, params.at(param), &full);
    read(param, full, block, t);
  }
}

int64_t ModelRuntime::ownedParameterCount() {
  const Placement& placement = model_->placement;
  int64_t owned = 0;
  for (const auto& item : model_->module().named_parameters()) {
    owned += placement.held(item.key()) && !placement.mirror(item.key()) ? 1 : 0;
  }
  auto ppGroup = groups_->group(GroupKind::kPipeline);
  if (ppGroup->size() > 1) {
    at::Tensor total = torch::tensor({owned}, torch::TensorOptions(torch::kInt64).device(device()));
    ppGroup->allreduce(total)->wait();
    owned = total.item<int64_t>();
  }
  return owned;
}

void ModelRuntime::loadCheckpoint(CheckpointReader& reader, const std::string& source, bool withOptimizer,
                                  int64_t optimizerSteps) {
  awaitParameters();  // nothing in flight may overwrite what is read
  torch::NoGradGuard noGrad;
  const Placement& placement = model_->placement;
  const std::string& dir = reader.dir();
  // `name` of whole sizes `full` in `section`, or nullopt when the checkpoint
  // lacks it; another shape is another model.
  auto saved = [&](CheckpointSection section, const std::string& name, const std::vector<int64_t>& full) {
    auto info = reader.find(source, section, name);
    if (info && info->shape != full) {
      throw CheckpointError(detail::concat(dir, ": ", toString(section), " tensor '", name, "' has shape ",
                                           shapeString(info->shape), ", this model has ", shapeString(full),
                                           ": the checkpoint is from another model"));
    }
    return info.has_value();
  };
  auto missing = [&](const char* what, const std::string& name) {
    return CheckpointError(detail::concat(dir, ": no ", what, " '", name, "' of model '", source,
                                          "': the checkpoint is from another model"));
  };
  // A float32 value of parameter `name`: its float32 master when the
  // checkpoint kept one (it trained in a lower precision), else the parameter.
  auto readFloat32 = [&](const std::string& name, const std::vector<int64_t>& full, const TensorBlock& block,
                         at::Tensor out) {
    if (saved(CheckpointSection::kOptimizer, "master." + name, full)) {
      reader.read(source, CheckpointSection::kOptimizer, "master." + name, block, out);
    } else {
      if (!saved(CheckpointSection::kParameters, name, full)) throw missing("parameter", name);
      reader.read(source, CheckpointSection::kParameters, name, block, out);
    }
  };

  std::map<std::string, at::Tensor> params;
  for (auto& item : model_->module().named_parameters()) {
    const std::string& name = item.key();
    if (!placement.held(name)) continue;  // another pipeline stage's
    at::Tensor p = item.value().detach();
    params.emplace(name, p);
    const ParameterPlacement& where = placement.of(name);
    const std::vector<int64_t> full = where.fullSizes(p.sizes());
    if (!saved(CheckpointSection::kParameters, name, full)) throw missing("parameter", name);
    const TensorBlock block = blockOf(where, p);
    auto info = reader.find(source, CheckpointSection::kParameters, name);
    if (p.scalar_type() == at::kFloat && info->dtype != at::kFloat) {
      readFloat32(name, full, block, p);
    } else {
      reader.read(source, CheckpointSection::kParameters, name, block, p);
    }
  }
  if (!withOptimizer || optimizer_ == nullptr) return;

  if (distributed_) {
    for (auto& piece : distributed_->pieces()) {
      const ParameterPlacement& where = placement.of(piece.name);
      const TensorBlock block = pieceBlock(where, piece);
      const std::vector<int64_t> full = where.fullSizes(piece.param_sizes);
      for (auto& [slot, t] : piece.slots) {
        const std::string name = slot + "." + piece.name;
        if (!saved(CheckpointSection::kOptimizer, name, full)) throw missing("optimizer state", name);
        reader.read(source, CheckpointSection::kOptimizer, name, block, t);
      }
      readFloat32(piece.name, full, block, piece.master);
    }
    distributed_->setStepCount(optimizerSteps);
  } else {
    for (auto& [name, t] : optimizer_->state()) {
      const std::string param = parameterOfState(name);
      std::vector<int64_t> full;
      const TensorBlock block = stateBlock(name, placement.of(param), t, params.at(param), &full);
      if (name.rfind("master.", 0) == 0) {
        readFloat32(param, full, block, t);
        continue;
      }
      if (!saved(CheckpointSection::kOptimizer, name, full)) throw missing("optimizer state", name);
      reader.read(source, CheckpointSection::kOptimizer, name, block, t);
    }
    optimizer_->setStepCount(optimizerSteps);
  }
  std::map<std::string, at::Tensor> precisionState;
  for (const auto& name : reader.names(source, CheckpointSection::kOptimizer)) {
    if (name.rfind(kPrecisionPrefix, 0) == 0) {
      precisionState[name.substr(std::strlen(kPrecisionPrefix))] =
          reader.readWhole(source, CheckpointSection::kOptimizer, name);
    }
  }
  try {
    precision_->loadState(precisionState);
  } catch (const CheckpointError& e) {
    throw CheckpointError(detail::concat(dir, ": ", e.what()));
  }
}

}  // namespace ptrain

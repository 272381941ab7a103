// parallel/pipeline: pipeline parallelism over the model's block sequence.
//
// planBuild() cuts the blocks into p * v virtual stages (parallel.pipeline_layout,
// or runs of equal cost, StagedModel::blockCost) before the model exists, so
// that this rank builds only its chunks, the embedding on the first stage and
// the head on the last. apply() records every parameter's stage in the
// placement and releases whatever the model built beyond that (placement
// held = false). Parameters the head shares with the embedding (a tied output
// embedding) are kept on the last stage as a copy (placement mirror) whose
// gradient finishGradients() sums with the first stage's, so both copies take
// the same update.
//
// runMicroBatches() walks this stage's schedule (ptrain/pipeline/schedule.h):
// a forward pass receives its input from the previous virtual stage (or
// embeds the micro-batch), runs the chunk's blocks (through the runtime's
// block hooks) and sends the output on (or computes the step's loss); a
// backward pass receives the output gradient (or starts from the loss),
// runs autograd and sends the input gradient back. The runtime's
// beforeBackward hooks run before every backward pass.
//
// Measured per stage and step (stepStats, reported by rank 0 for every
// stage): busy time (forward and backward passes), idle time (blocked on
// receives and unfinished sends), the most micro-batches with live
// activations, and peak RSS. pp_bubble is the mean over stages of idle / busy,
// beside pp_bubble_formula: (p - 1) / m, or (p - 1) / (v m) interleaved.
#include <torch/torch.h>

#include <chrono>
#include <numeric>

#include "ptrain/comm/communicator.h"
#include "ptrain/core/logging.h"
#include "ptrain/core/resources.h"
#include "ptrain/engine/batch.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/parallel.h"
#include "ptrain/engine/placement.h"
#include "ptrain/pipeline/schedule.h"
#include "ptrain/recipe/recipe.h"
#include "stage_link.h"

namespace {

using namespace ptrain;
using namespace ptrain::pipeline;
using Clock = std::chrono::steady_clock;

bool startsWithAny(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const auto& prefix : prefixes)
    if (name.compare(0, prefix.size(), prefix) == 0) return true;
  return false;
}

class PipelineParallel final : public ParallelPlugin {
 public:
  // The layout dimensions it executes: pipeline stages (and their virtual chunks).
  static constexpr const char* kExecutes = "pp";
  explicit PipelineParallel(const PluginContext& ctx) : device_(ctx.device) {
    if (ctx.recipe == nullptr) return;
    const Recipe& recipe = *ctx.recipe;
    kind_ = scheduleFromName(recipe.getString("parallel.pipeline_schedule"));
    if (recipe.has("parallel.pipeline_layout")) {
      for (int64_t n : recipe.getIntList("parallel.pipeline_layout")) layout_.push_back(static_cast<int>(n));
    }
  }

  // Blocks of each virtual stage: parallel.pipeline_layout, or runs of equal
  // cost.
  std::vector<std::vector<int>> partition(StagedModel& model, int virtualStages) const {
    const int numBlocks = model.numBlocks();
    std::vector<int> sizes = layout_;
    if (sizes.empty()) {
      std::vector<int64_t> costs;
      for (int b = 0; b < numBlocks; ++b) costs.push_back(model.blockCost(b));
      sizes = balancedPartition(costs, virtualStages);
    }
    PTRAIN_CHECK_AS(ConfigError, static_cast<int>(sizes.size()) == virtualStages,
                    "parallel.pipeline_layout: ", sizes.size(), " entries, but the pipeline has ", virtualStages,
                    " (virtual) stages; give one entry per stage");
    PTRAIN_CHECK_AS(ConfigError, std::accumulate(sizes.begin(), sizes.end(), 0) == numBlocks,
                    "parallel.pipeline_layout: the entries sum to ", std::accumulate(sizes.begin(), sizes.end(), 0),
                    ", but the model has ", numBlocks, " blocks");
    std::vector<std::vector<int>> blocks(static_cast<size_t>(virtualStages));
    int next = 0;
    for (int g = 0; g < virtualStages; ++g)
      for (int i = 0; i < sizes[static_cast<size_t>(g)]; ++i) blocks[static_cast<size_t>(g)].push_back(next++);
    return blocks;
  }

  // The virtual chunks per stage come from the layout this rank runs in, not
  // the recipe's job-wide key: a device group (parallel.groups) has its own
  // vpp, and interleaves whenever it is above 1 (the layout check refuses an
  // interleaved schedule without chunks and chunks without one).
  void takeChunks(const LayoutGroups& groups) {
    chunks_ = groups.layout().vpp();
    if (chunks_ > 1) kind_ = ScheduleKind::kInterleaved;
  }

  void planBuild(StagedModel& outline, const LayoutGroups& groups, ModelBuild& build) override {
    auto group = groups.group(GroupKind::kPipeline);
    takeChunks(groups);
    blocks_ = partition(outline, group->size() * chunks_);
    std::vector<int> mine;
    for (int c = 0; c < chunks_; ++c) {
      const auto& b = blocks_[static_cast<size_t>(c * group->size() + group->rank())];
      mine.insert(mine.end(), b.begin(), b.end());
    }
    std::sort(mine.begin(), mine.end());
    build.blocks = mine;
    build.embed = group->rank() == 0;
    build.head = group->rank() == group->size() - 1;
  }

  void apply(StagedModel& model, const LayoutGroups& groups) override {
    auto group = groups.group(GroupKind::kPipeline);
    const int stages = group->size();
    takeChunks(groups);
    if (blocks_.empty()) blocks_ = partition(model, stages * chunks_);  // built whole, without planBuild
    link_ = std::make_shared<StageLink>(group, chunks_, blocks_);

    // What this stage holds.
    std::vector<std::string> local;
    for (int c = 0; c < chunks_; ++c)
      for (int b : link_->blocksOf(link_->virtualStage(c))) local.push_back(model.blockPrefix(b));
    if (link_->isFirstStage())
      for (const auto& p : model.embedPrefixes()) local.push_back(p);
    if (link_->isLastStage())
      for (const auto& p : model.headPrefixes()) local.push_back(p);
    const std::vector<std::string> shared = model.headSharedParameters();
    checkPlacement(model, shared);

    torch::NoGradGuard noGrad;
    int64_t kept = 0;
    for (auto& item : model.module().named_parameters()) {
      const std::string& name = item.key();
      at::Tensor& param = item.value();
      ParameterPlacement& placement = model.placement.edit(name);
      const bool isShared = std::find(shared.begin(), shared.end(), name) != shared.end();
      if (startsWithAny(name, local)) {
        placement.stage = link_->rank();
        if (isShared) {
          // Each end computes part of its gradient: finishGradients sums them.
          placement.partial_gradient = true;
          tied_.push_back(param);
        }
      } else if (isShared && link_->isLastStage()) {
        placement.stage = 0;  // the embedding's owner
        placement.mirror = true;
        placement.partial_gradient = true;
        tied_.push_back(param);
      } else {
        // Built here but another stage's (e.g. the positions of an embedding
        // the last stage builds only for its tied weight).
        placement.held = false;
        param.set_data(at::empty({0}, param.options()));
        param.requires_grad_(false);
        continue;
      }
      kept += param.numel();
      link_->setDevice(param.device());
    }
    model.pipeline = link_;
    std::string mine;
    for (int c = 0; c < chunks_; ++c) {
      const auto& b = link_->blocksOf(link_->virtualStage(c));
      mine += (c ? ", " : "") + (b.empty() ? std::string("none")
                                           : std::to_string(b.front()) + ".." + std::to_string(b.back()));
    }
    logger()->debug("pipeline over {}: stage {} of {}, {} schedule, blocks {}, {} parameter values held",
                    group->name(), link_->rank(), stages, toString(kind_), mine, kept);
  }

  // Every parameter must belong to a block, the embedding or the head, or no
  // stage would hold (and train) it; parameters the head shares must be the
  // embedding's, which the first stage owns.
  static void checkPlacement(StagedModel& model, const std::vector<std::string>& shared) {
    std::vector<std::string> all = model.embedPrefixes();
    for (const auto& p : model.headPrefixes()) all.push_back(p);
    for (int b = 0; b < model.numBlocks(); ++b) all.push_back(model.blockPrefix(b));
    for (const auto& item : model.module().named_parameters()) {
      PTRAIN_CHECK(startsWithAny(item.key(), all), "pipeline: parameter '", item.key(),
                   "' is in no block and not under the model's embed or head prefixes, so no stage would hold "
                   "it; the model's StagedModel prefixes must cover every parameter");
    }
    for (const auto& name : shared) {
      PTRAIN_CHECK(startsWithAny(name, model.embedPrefixes()), "pipeline: head-shared parameter '", name,
                   "' is not under the model's embed prefixes; headSharedParameters() must name embedding "
                   "parameters");
    }
  }

  std::optional<double> runMicroBatches(const MicroBatchRun& run) override {
    StagedModel& model = *run.model;
    const auto& micro = *run.micro_batches;
    const int m = static_cast<int>(micro.size());
    const int p = link_->stages();
    const std::vector<Pass> passes = buildSchedule(kind_, p, chunks_, m, link_->rank());
    const int backwardCount = m * chunks_;

    // Per (chunk, micro-batch): what its backward pass needs.
    struct Slot {
      at::Tensor input;   // received activation (a leaf), undefined on virtual stage 0
      at::Tensor output;  // sent activation, or the scaled loss on the last virtual stage
    };
    std::vector<Slot> slots(static_cast<size_t>(chunks_ * m));
    link_->resetIdle();
    const auto start = Clock::now();
    double lossSum = 0;
    int alive = 0, mostAlive = 0, backwardIndex = 0;

    for (const Pass& pass : passes) {
      const int g = link_->virtualStage(pass.chunk);
      const bool last = g == link_->lastVirtualStage();
      Slot& slot = slots[static_cast<size_t>(pass.chunk * m + pass.micro)];
      const Batch& batch = micro[static_cast<size_t>(pass.micro)];
      if (pass.forward) {
        at::Tensor x;
        if (g == 0) {
          x = model.embed(batch);
        } else {
          x = link_->recvActivation(g, pass.micro == 0).requires_grad_(true);
          slot.input = x;
        }
        for (int block : link_->blocksOf(g)) x = run.run_block(block, x);
        if (last) {
          LossOutput out = run.loss(x, batch);
          lossSum += out.loss_sum.item<double>();
          slot.output = run.backwardLoss(out.loss_sum);
        } else {
          slot.output = x;
          link_->sendActivation(g + 1, x.detach(), pass.micro == 0);
        }
        mostAlive = std::max(mostAlive, ++alive);
      } else {
        if (run.before_backward) run.before_backward(backwardIndex, backwardCount);
        ++backwardIndex;
        if (last) {
          slot.output.backward();
        } else {
          at::Tensor grad = link_->recvGradient(g, slot.output);
          torch::autograd::backward({slot.output}, {grad});
        }
        if (g > 0) {
          at::Tensor inputGrad = slot.input.grad();
          link_->sendGradient(g - 1, inputGrad.defined() ? inputGrad : torch::zeros_like(slot.input));
        }
        slot = Slot{};
        --alive;
      }
    }
    link_->waitSends();
    const double total = std::chrono::duration<double>(Clock::now() - start).count();
    const double idle = link_->idleSeconds();
    recordStats(total - idle, idle, mostAlive, m);
    return lossSum;
  }

  void finishGradients() override {
    // The first and the last stage each hold a partial gradient of the tied
    // parameters; both end with the same sum (a + b == b + a, bit for bit).
    for (auto& param : tied_) {
      at::Tensor mine = param.grad().defined() ? param.grad() : torch::zeros_like(param);
      at::Tensor other = link_->exchangeWithOtherEnd(mine);
      param.mutable_grad() = mine + other;
    }
  }

  std::map<std::string, double> stepStats() const override { return stats_; }

 private:
  // Every stage's figures, gathered over the pipeline group so that rank 0
  // (stage 0) can report them all.
  void recordStats(double busy, double idle, int mostAlive, int m) {
    const int p = link_->stages();
    const auto options = torch::TensorOptions(torch::kFloat64).device(device_);
    at::Tensor mine = torch::tensor({busy, idle, static_cast<double>(mostAlive), peakRssMb()}, options);
    at::Tensor all = torch::empty({p * 4}, options);
    link_->group().allgather(all, mine)->wait();
    all = all.cpu();
    const double* v = all.data_ptr<double>();
    stats_.clear();
    double bubble = 0;
    int inflight = 0;
    for (int s = 0; s < p; ++s) {
      const std::string stage = "pp_stage" + std::to_string(s) + "_";
      stats_[stage + "busy_s"] = v[4 * s];
      stats_[stage + "idle_s"] = v[4 * s + 1];
      stats_[stage + "inflight_max"] = v[4 * s + 2];
      stats_[stage + "peak_rss_mb"] = v[4 * s + 3];
      bubble += v[4 * s] > 0 ? v[4 * s + 1] / v[4 * s] : 0;
      inflight = std::max(inflight, static_cast<int>(v[4 * s + 2]));
    }
    stats_["pp_bubble"] = bubble / p;
    stats_["pp_bubble_formula"] = bubbleFormula(kind_, p, chunks_, m);
    stats_["pp_inflight_max"] = inflight;
  }

  at::Device device_{at::kCPU};
  int chunks_ = 1;
  ScheduleKind kind_ = ScheduleKind::kOneFOneB;
  std::vector<int> layout_;
  std::vector<std::vector<int>> blocks_;  // per virtual stage
  std::shared_ptr<StageLink> link_;
  std::vector<at::Tensor> tied_;  // on the first and the last stage
  std::map<std::string, double> stats_;
};

}  // namespace

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kParallel, "pipeline", "0.1.0", PipelineParallel)

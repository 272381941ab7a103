// parallel/data: data parallelism with bucketed, overlapped gradient
// all-reduce.
//
// Each parameter's gradient is summed over the group its placement names
// (Placement::gradientReduceGroup: the data-parallel group for dense
// parameters, the expert-data group for experts). Per group, parameters are
// packed, in reverse order of registration (roughly the order in which
// backward produces their gradients), into buckets of about
// parallel.grad_bucket_size_mb. During the backward pass of the last
// micro-batch of a step, a hook after each parameter's gradient accumulation
// marks it ready; when a bucket is full its gradients are flattened into one
// buffer and all-reduced asynchronously while backward goes on. Buckets are
// launched strictly in index order within their group, so every member issues
// the same sequence of collectives. finishGradients() waits and writes the
// sums back.
//
// The engine scales each micro-batch loss by 1 / (items in the global batch),
// so the sum over data-parallel ranks is exactly the single-rank gradient.
#include <utility>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <chrono>

#include "ptrain/comm/communicator.h"
#include "ptrain/core/logging.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/parallel.h"
#include "ptrain/engine/placement.h"
#include "ptrain/recipe/recipe.h"

namespace {

using namespace ptrain;

struct Bucket {
  std::vector<at::Tensor> params;
  std::vector<int64_t> offsets;  // element offset of each param in buffer
  at::Tensor buffer;
  int ready = 0;
  std::shared_ptr<Work> work;
};

// The buckets of the parameters reduced over one group.
struct ReduceSet {
  std::shared_ptr<ProcessGroup> group;
  std::vector<Bucket> buckets;
  int nextToLaunch = 0;
};

class DataParallel final : public ParallelPlugin {
 public:
  explicit DataParallel(const PluginContext& ctx) : device_(ctx.device) {
    if (ctx.recipe != nullptr) {
      bucketBytes_ = static_cast<int64_t>(ctx.recipe->getFloat("parallel.grad_bucket_size_mb") * (1 << 20));
      overlap_ = ctx.recipe->getBool("parallel.overlap_grad_reduce");
    }
  }

  void apply(StagedModel& model, const LayoutGroups& groups) override {
    // Parameters by reduction group, in reverse order of registration.
    std::map<GroupKind, std::vector<at::Tensor>> byGroup;
    auto params = model.localParameters();
    for (auto it = params.rbegin(); it != params.rend(); ++it) {
      if (!it->second.requires_grad()) continue;
      const GroupKind kind = Placement::gradientReduceGroup(model.placement.of(it->first), groups.layout());
      if (groups.group(kind)->size() > 1) byGroup[kind].push_back(it->second);
    }
    for (auto& [kind, list] : byGroup) {
      sets_.emplace_back();
      ReduceSet& set = sets_.back();
      set.group = groups.group(kind);
      int64_t used = bucketBytes_;  // forces a new bucket for the first param
      for (const at::Tensor& p : list) {
        const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
        if (set.buckets.empty() || used + bytes > bucketBytes_) {
          set.buckets.emplace_back();
          used = 0;
        }
        Bucket& b = set.buckets.back();
        const int64_t offset = b.offsets.empty() ? 0 : b.offsets.back() + b.params.back().numel();
        b.params.push_back(p);
        b.offsets.push_back(offset);
        used += bytes;
        hookParam(p, sets_.size() - 1, set.buckets.size() - 1);
      }
      logger()->debug("data parallel over {}: {} buckets of up to {} MiB", set.group->name(), set.buckets.size(),
                      bucketBytes_ >> 20);
    }
  }

  void beforeBackward(int index, int count) override {
    armed_ = overlap_ && !sets_.empty() && index == count - 1;
    if (armed_) resetStep();
  }

  void finishGradients() override {
    if (sets_.empty()) return;
    if (!armed_) resetStep();
    auto waitStart = std::chrono::steady_clock::now();
    for (size_t s = 0; s < sets_.size(); ++s) {
      // Buckets whose parameters got no gradient this step (unused in the
      // forward pass) and, without overlap, all buckets are launched now.
      while (sets_[s].nextToLaunch < static_cast<int>(sets_[s].buckets.size())) launch(s, sets_[s].nextToLaunch);
    }
    for (auto& set : sets_) {
      for (auto& b : set.buckets) {
        b.work->wait();
        for (size_t i = 0; i < b.params.size(); ++i) {
          auto& p = b.params[i];
          auto slice = b.buffer.narrow(0, b.offsets[i], p.numel()).view(p.sizes());
          if (p.mutable_grad().defined()) p.mutable_grad().copy_(slice);
          else p.mutable_grad() = slice.clone();
        }
      }
    }
    waitSeconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - waitStart).count();
    armed_ = false;
  }

  std::map<std::string, double> stepStats() const override {
    if (sets_.empty()) return {};
    return {{"dp_comm_bytes", static_cast<double>(bytesThisStep_)}, {"dp_wait_s", waitSeconds_}};
  }

 private:
  void resetStep() {
    for (auto& set : sets_) {
      for (auto& b : set.buckets) {
        b.ready = 0;
        b.work.reset();
      }
      set.nextToLaunch = 0;
    }
    bytesThisStep_ = 0;
  }

  void hookParam(const at::Tensor& p, size_t setIndex, size_t bucketIndex) {
    auto acc = torch::autograd::impl::grad_accumulator(p);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, setIndex, bucketIndex](const torch::autograd::variable_list& outputs,
                                      const torch::autograd::variable_list&) {
          onGradReady(setIndex, bucketIndex);
          return outputs;
        }));
    // The parameter holds its accumulator only weakly: keep it alive, or a
    // new one without our hook would be made.
    accumulators_.push_back(std::move(acc));
  }

  void onGradReady(size_t setIndex, size_t bucketIndex) {
    if (!armed_) return;
    ReduceSet& set = sets_[setIndex];
    ++set.buckets[bucketIndex].ready;
    while (set.nextToLaunch < static_cast<int>(set.buckets.size()) &&
           set.buckets[set.nextToLaunch].ready == static_cast<int>(set.buckets[set.nextToLaunch].params.size())) {
      launch(setIndex, set.nextToLaunch);
    }
  }

  void launch(size_t setIndex, int index) {
    ReduceSet& set = sets_[setIndex];
    Bucket& b = set.buckets[index];
    // The buffer takes the gradients' dtype (float32 main gradients under
    // bf16 and fp16, which the precision plugin creates before backward).
    at::ScalarType dtype = b.params.front().scalar_type();
    for (const auto& p : b.params) {
      if (p.grad().defined()) {
        dtype = p.grad().scalar_type();
        break;
      }
    }
    if (!b.buffer.defined() || b.buffer.scalar_type() != dtype) {
      const int64_t n = b.offsets.back() + b.params.back().numel();
      // On the model's device, where the collectives run (an offloaded
      // parameter may rest on the host).
      b.buffer = torch::empty({n}, b.params.front().options().dtype(dtype).device(device_).requires_grad(false));
    }
    for (size_t i = 0; i < b.params.size(); ++i) {
      const auto& p = b.params[i];
      auto slice = b.buffer.narrow(0, b.offsets[i], p.numel());
      if (p.grad().defined()) slice.copy_(p.grad().reshape({-1}));
      else slice.zero_();
    }
    b.work = set.group->allreduce(b.buffer);
    bytesThisStep_ += b.buffer.numel() * static_cast<int64_t>(b.buffer.element_size());
    ++set.nextToLaunch;
  }

  at::Device device_;
  int64_t bucketBytes_ = 4 << 20;
  bool overlap_ = true;
  bool armed_ = false;
  std::vector<ReduceSet> sets_;
  // A shared_ptr in libtorch 1.13, an intrusive_ptr in later releases.
  using AccumulatorPtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));
  std::vector<AccumulatorPtr> accumulators_;
  int64_t bytesThisStep_ = 0;
  double waitSeconds_ = 0;
};

}  // namespace

PTRAIN_DEFINE_PLUGIN(ptrain::plugin_kind::kParallel, "data", "0.1.0", DataParallel)

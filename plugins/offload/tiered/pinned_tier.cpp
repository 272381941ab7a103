// offload/tiered, the pinned host tier (device cuda): parameters, gradients
// and optimizer states rest in page-locked host memory, which the GPU copies
// from and to at the link's full rate and asynchronously
// (engine/offload.h for the keys and the contract).
//
// Parameters (offload.params): a block's parameters rest on the host (the
// parameter *is* its pinned region between uses, so a checkpoint or a
// weight load reads and writes them there). Before the block runs (forward,
// or its backward) each comes to the device and the parameter points at the
// device copy (Tensor::set_data, which autograd's saved copy of a leaf
// follows); afterwards it points back at its region and the device copy
// returns to the caching allocator. The next block's copies (block + 1 in
// forward, block - 1 in backward) are started ahead on a side stream, so they
// overlap the current block's kernels; the compute stream waits for them
// only when it needs them. The embedding and the head stay on the device.
//
// Gradients (offload.grads): a block's gradients rest on the host too. They
// come to the device before the block's backward (backward accumulates into
// them there, micro-batch after micro-batch) and go back after it; the data
// plugin's reduction writes its sums into them wherever they are. The
// embedding's and the head's stay on the device.
//
// Optimizer (offload.optimizer): the moments and float32 masters rest on the
// host and the optimizer steps there, parameter by parameter, with the host
// AdamW kernel: each parameter's gradient and values come to the host for
// its update (those that rest there already are updated in place) and go
// back to the device after. Without it, the optimizer steps on the device,
// and an offloaded parameter and its gradient come in for their update.
//
// Values: the same kernels run on the same numbers in the same order, so
// losses are bitwise those of the run without offload for parameters and
// gradients; the offloaded optimizer runs the host's AdamW kernel instead of
// the GPU's, which agree to float32 rounding, and the norm of gradients that
// rest on the host is summed by the host (equal to rounding; it changes the
// update only when clipping applies).
#include <torch/torch.h>

#include <map>
#include <vector>

#include "ptrain/core/logging.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/optimizer.h"
#include "tiers.h"

#if PTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ptrain {

#if PTRAIN_WITH_CUDA
namespace {

// A page-locked host tensor shaped like `like`, of `dtype`, with its values.
at::Tensor pinnedCopy(const at::Tensor& like, at::ScalarType dtype) {
  at::Tensor region = at::empty(like.sizes(), at::TensorOptions().dtype(dtype).pinned_memory(true));
  region.copy_(like.detach());
  return region;
}

// An offloaded gradient of a block's parameter.
struct RestingGradient {
  at::Tensor param;
  at::Tensor region;  // undefined until the first backward made the gradient
};

// A block's parameters copied to the device ahead of their use, on the side
// stream; `done` marks the end of the copies.
struct Staged {
  std::vector<at::Tensor> tensors;  // in the block's order
  at::cuda::CUDAEvent done;
};

class PinnedOffload final : public OffloadPlugin {
 public:
  explicit PinnedOffload(const PluginContext& ctx)
      : ctx_(ctx), copies_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, ctx.device.index())) {}

  // The model may outlive the plugin (ModelRuntime::sharedModel()): its
  // parameters and gradients go back to the device.
  ~PinnedOffload() override {
    torch::NoGradGuard noGrad;
    dropStaged();
    for (auto& block : blocks_)
      for (auto& rp : block)
        if (rp.users == 0) rp.param.set_data(rp.region.to(ctx_.device));
    for (auto& block : grads_)
      for (auto& rg : block)
        if (rg.param.grad().defined() && rg.param.grad().is_cpu()) rg.param.mutable_grad() = rg.param.grad().to(ctx_.device);
  }

  void attachModel(StagedModel& model, const OffloadSettings& settings) override {
    settings_ = settings;
    torch::NoGradGuard noGrad;
    c10::cuda::CUDAGuard guard(ctx_.device);
    auto named = model.localParameters();
    blocks_.resize(static_cast<size_t>(model.numBlocks()));
    grads_.resize(static_cast<size_t>(model.numBlocks()));
    for (int b = 0; b < model.numBlocks(); ++b) {
      const std::string prefix = model.blockPrefix(b);
      for (const auto& [name, p] : named) {
        if (name.rfind(prefix, 0) != 0) continue;
        if (settings.params) {
          at::Tensor region = pinnedCopy(p, p.scalar_type());
          p.set_data(region);
          blocks_[static_cast<size_t>(b)].push_back(RestingParameter{p, region, 0});
          hostBytes_ += bytesOf(region);
        }
        if (settings.grads && p.requires_grad()) grads_[static_cast<size_t>(b)].push_back(RestingGradient{p, {}});
      }
    }
    // The device copies are free: give them back to the driver, so that the
    // memory the GPU reports is what the run holds.
    c10::cuda::CUDACachingAllocator::emptyCache();
  }

  void attachOptimizer(Optimizer& optimizer) override {
    optimizer_ = &optimizer;
    torch::NoGradGuard noGrad;
    // The optimizer made its state beside each parameter: on the host for
    // those that rested there. Offloaded, every state rests on the host;
    // otherwise every state lives on the device.
    for (size_t i = 0; i < optimizer.parameters().size(); ++i) {
      for (const auto& t : optimizer.stateOf(i)) {
        if (settings_.optimizer) {
          if (!t.is_pinned()) {
            t.set_data(pinnedCopy(t, t.scalar_type()));
            hostBytes_ += bytesOf(t);
          }
        } else if (t.device() != ctx_.device) {
          t.set_data(t.to(ctx_.device));
        }
      }
    }
    c10::cuda::CUDACachingAllocator::emptyCache();
    optimizer.update_observer = [this](size_t index, bool done) {
      if (done) afterUpdate();
      else beforeUpdate(optimizer_->parameters()[index]);
    };
    if (ctx_.rank == 0 && ctx_.logger) {
      ctx_.logger->info("offload: {}{}{}in pinned host memory ({:.1f} MiB of parameters and optimizer states)",
                        settings_.params ? "parameters " : "", settings_.grads ? "gradients " : "",
                        settings_.optimizer ? "optimizer states " : "", static_cast<double>(hostBytes_) / (1 << 20));
    }
  }

  void beginStep(const StepInfo&) override {
    inBytes_ = outBytes_ = 0;
    torch::NoGradGuard noGrad;
    // A plugin that gave the parameters their gradients before the step (the
    // precision plugin's float32 zeros) made them beside the parameter: on
    // the host for a resting one. An offloaded gradient rests in its region;
    // any other lives on the device, where backward accumulates.
    for (auto& block : grads_) {
      for (auto& rg : block) {
        const at::Tensor& g = rg.param.grad();
        if (!g.defined() || (rg.region.defined() && g.data_ptr() == rg.region.data_ptr())) continue;
        if (!rg.region.defined() || rg.region.scalar_type() != g.scalar_type()) {
          rg.region = pinnedCopy(g, g.scalar_type());
        } else {
          rg.region.copy_(g);
        }
        rg.param.mutable_grad() = rg.region;
      }
    }
    for (auto& block : blocks_) {
      for (auto& rp : block) {
        const at::Tensor& g = rp.param.grad();
        if (g.defined() && g.is_cpu() && !restsOnHost(rp.param, g)) rp.param.mutable_grad() = g.to(ctx_.device);
      }
    }
  }

  at::Tensor runBlock(int index, const at::Tensor& input, const BlockRunner& next) override {
    if (!settings_.params) return next(input);
    // A use inside another (a recomputation in the block's backward) is not
    // followed by the next block's forward: nothing to copy ahead.
    const bool nested = validBlock(index) && !blocks_[static_cast<size_t>(index)].empty() &&
                        blocks_[static_cast<size_t>(index)].front().users > 0;
    bringIn(index);
    if (!nested) prefetch(index + 1);
    at::Tensor out = next(input);
    sendBack(index);
    return out;
  }

  bool observesBlockBackward() const override { return settings_.params || settings_.grads; }

  void beforeBlockBackward(int index) override {
    if (settings_.params) {
      bringIn(index);
      prefetch(index - 1);
    }
    if (settings_.grads) gradientsIn(index);
  }

  void afterBlockBackward(int index) override {
    if (settings_.params) sendBack(index);
    if (settings_.grads) gradientsOut(index);
  }

  // The host reads the gradients next (the norm, the data plugin's sums):
  // the copies that took them there are finished first.
  void finishGradients() override {
    if (settings_.grads) c10::cuda::getCurrentCUDAStream(ctx_.device.index()).synchronize();
  }

  // The optimizer writes the regions next: copies made ahead of the step
  // would hold the old values.
  bool mayStep(const GradientCheck&) override {
    dropStaged();
    return true;
  }

  std::map<std::string, double> stepStats() const override {
    return {{"offload_in_bytes", static_cast<double>(inBytes_)},
            {"offload_out_bytes", static_cast<double>(outBytes_)},
            {"offload_host_bytes", static_cast<double>(hostBytes_)}};
  }

 private:
  bool validBlock(int index) const { return index >= 0 && index < static_cast<int>(blocks_.size()); }

  bool restsOnHost(const at::Tensor& p, const at::Tensor& g) const {
    for (const auto& block : grads_)
      for (const auto& rg : block)
        if (rg.param.unsafeGetTensorImpl() == p.unsafeGetTensorImpl())
          return rg.region.defined() && g.data_ptr() == rg.region.data_ptr();
    return false;
  }

  // Starts copying block `index`'s parameters to the device on the side
  // stream, unless they are there or on their way.
  void prefetch(int index) {
    if (!validBlock(index) || staged_.count(index) > 0) return;
    auto& block = blocks_[static_cast<size_t>(index)];
    if (block.empty()) return;
    for (const auto& rp : block)
      if (rp.users > 0) return;
    c10::cuda::CUDAGuard guard(ctx_.device);
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(ctx_.device.index());
    // The device memory comes from the compute stream's pool (it is used and
    // freed there); the copies wait until the compute stream reached this
    // point, so they never write memory an earlier kernel still reads.
    Staged staged;
    for (const auto& rp : block)
      staged.tensors.push_back(at::empty(rp.region.sizes(), rp.region.options().device(ctx_.device).pinned_memory(false)));
    at::cuda::CUDAEvent allocated;
    allocated.record(compute);
    {
      c10::cuda::CUDAStreamGuard onCopies(copies_);
      allocated.block(copies_);
      for (size_t i = 0; i < block.size(); ++i) staged.tensors[i].copy_(block[i].region, /*non_blocking=*/true);
      staged.done.record(copies_);
    }
    staged_.emplace(index, std::move(staged));
  }

  void bringIn(int index) {
    if (!validBlock(index)) return;
    torch::NoGradGuard noGrad;
    auto& block = blocks_[static_cast<size_t>(index)];
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(ctx_.device.index());
    auto staged = staged_.find(index);
    if (staged != staged_.end()) staged->second.done.block(compute);
    for (size_t i = 0; i < block.size(); ++i) {
      RestingParameter& rp = block[i];
      if (rp.users++ > 0) continue;
      at::Tensor working;
      if (staged != staged_.end()) {
        working = staged->second.tensors[i];
      } else {
        working = at::empty(rp.region.sizes(), rp.region.options().device(ctx_.device).pinned_memory(false));
        working.copy_(rp.region, /*non_blocking=*/true);
      }
      rp.param.set_data(working);
      inBytes_ += bytesOf(working);
    }
    if (staged != staged_.end()) staged_.erase(staged);
  }

  // Nothing writes a parameter while its block runs: the region still holds
  // its values, and the device copy is simply let go.
  void sendBack(int index) {
    if (!validBlock(index)) return;
    for (auto& rp : blocks_[static_cast<size_t>(index)])
      if (--rp.users == 0) rp.param.set_data(rp.region);
  }

  // Copies in flight finish before their memory goes back to the allocator.
  void dropStaged() {
    for (auto& [index, staged] : staged_) staged.done.synchronize();
    staged_.clear();
  }

  void gradientsIn(int index) {
    if (!validBlock(index)) return;
    for (auto& rg : grads_[static_cast<size_t>(index)]) {
      const at::Tensor& g = rg.param.grad();
      if (!g.defined() || !g.is_cpu()) continue;
      at::Tensor working = at::empty(g.sizes(), g.options().device(ctx_.device).pinned_memory(false));
      working.copy_(g, /*non_blocking=*/true);
      rg.param.mutable_grad() = working;
      inBytes_ += bytesOf(working);
    }
  }

  // To the host, asynchronously on the compute stream (which owns the device
  // copy until then); finishGradients() waits before the host reads them.
  void gradientsOut(int index) {
    if (!validBlock(index)) return;
    torch::NoGradGuard noGrad;
    for (auto& rg : grads_[static_cast<size_t>(index)]) {
      const at::Tensor& g = rg.param.grad();
      if (!g.defined() || g.is_cpu()) continue;
      if (!rg.region.defined() || rg.region.scalar_type() != g.scalar_type()) {
        rg.region = at::empty(g.sizes(), at::TensorOptions().dtype(g.scalar_type()).pinned_memory(true));
      }
      rg.region.copy_(g, /*non_blocking=*/true);
      rg.param.mutable_grad() = rg.region;
      outBytes_ += bytesOf(rg.region);
    }
  }

  // One parameter's update: its values and gradient go where the optimizer
  // steps (the host when offloaded, else the device); afterUpdate() puts
  // them back.
  void beforeUpdate(const at::Tensor& p) {
    torch::NoGradGuard noGrad;
    const at::Device where = settings_.optimizer ? at::Device(at::kCPU) : ctx_.device;
    update_ = Update{p, {}, {}};
    if (p.device() != where) {
      update_.paramHome = p.data();
      at::Tensor there = settings_.optimizer ? pinnedCopy(p, p.scalar_type()) : p.data().to(where);
      p.set_data(there);
    }
    const at::Tensor& g = p.grad();
    if (g.defined() && g.device() != where) {
      update_.gradHome = g;
      p.mutable_grad() = settings_.optimizer ? pinnedCopy(g, g.scalar_type()) : g.to(where);
    }
  }

  void afterUpdate() {
    torch::NoGradGuard noGrad;
    at::Tensor& p = update_.param;
    if (update_.paramHome.defined()) {
      update_.paramHome.copy_(p.data());
      p.set_data(update_.paramHome);
    }
    // The update read the gradient and left it as it was.
    if (update_.gradHome.defined()) p.mutable_grad() = update_.gradHome;
    update_ = Update{};
  }

  struct Update {
    at::Tensor param;
    at::Tensor paramHome;  // where the values were before the update, when they moved
    at::Tensor gradHome;   // the same for the gradient
  };

  PluginContext ctx_;
  OffloadSettings settings_;
  c10::cuda::CUDAStream copies_;
  Optimizer* optimizer_ = nullptr;
  std::vector<std::vector<RestingParameter>> blocks_;  // offload.params, per block
  std::vector<std::vector<RestingGradient>> grads_;    // offload.grads, per block
  std::map<int, Staged> staged_;
  Update update_;
  int64_t hostBytes_ = 0;
  int64_t inBytes_ = 0;
  int64_t outBytes_ = 0;
};

}  // namespace

std::unique_ptr<OffloadPlugin> makePinnedOffload(const PluginContext& ctx) {
  return std::make_unique<PinnedOffload>(ctx);
}

#else

std::unique_ptr<OffloadPlugin> makePinnedOffload(const PluginContext& ctx) {
  throw ConfigError("offload/tiered: the pinned host tier needs a build with CUDA, and this model computes on " +
                    ctx.device.str());
}

#endif

}  // namespace ptrain

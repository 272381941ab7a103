// offload/tiered, the disk tier (device cpu): parameters, gradients and
// optimizer states rest in memory-mapped files and come in only while they
// are used (engine/offload.h for the keys and the contract; tiered.cpp picks
// the tier).
//
// The disk tier. One file per rank under the run folder's
// offload/, reserved at its full size (posix_fallocate, so a full disk is an
// error at start, not a crash later), mapped shared and unlinked at once: the
// space returns to the file system when the process ends, however it ends,
// and nothing is left behind for a resume to trip over. Every offloaded
// tensor gets a page-aligned region. A tensor at rest *is* its region (a
// tensor over the mapped pages), so anything that touches it between uses
// (a checkpoint, an evaluation) still reads the right values; after each use
// the plugin drops the region's pages from the process (madvise DONTNEED:
// the kernel keeps them in its page cache or writes them to the file), so
// they no longer count in the resident set, which stands for device memory
// on this tier. Before a use it asks the kernel to read the next region
// ahead (madvise WILLNEED), the disk tier's prefetch.
//
// Parameters (offload.params): the blocks' parameters. Before a block runs
// (forward, or its backward: StepHooks::beforeBlockBackward) each parameter
// is copied into a working tensor from the caching allocator and the
// parameter points at it (Tensor::set_data, which autograd's saved copy of a
// leaf follows); afterwards the parameter points back at its region and the
// working tensor returns to the allocator. Uses nest (a recomputation inside
// a backward), so a block is counted in and out. The embedding and the head
// stay resident.
//
// Gradients (offload.grads): every trained parameter's gradient is a tensor
// over its region from the first step on; backward accumulates into it in
// place, and a block's gradients leave the resident set after its backward.
//
// Optimizer (offload.optimizer): the moments and float32 masters are moved
// into regions once; the optimizer steps parameter by parameter
// (Optimizer::update_observer) with the host AdamW kernel, and after each
// parameter its state, its gradient and (when offloaded) the parameter leave
// the resident set.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "ptrain/core/host_allocator.h"
#include "ptrain/core/logging.h"
#include "ptrain/engine/model.h"
#include "ptrain/engine/offload.h"
#include "ptrain/engine/optimizer.h"
#include "tiers.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

int64_t pageSize() {
  static const int64_t size = ::sysconf(_SC_PAGESIZE);
  return size;
}

int64_t pageRound(int64_t bytes) { return (bytes + pageSize() - 1) / pageSize() * pageSize(); }

// Regions start on a page and own their last page.
void advise(const at::Tensor& region, int advice) {
  if (region.numel() == 0) return;
  ::madvise(region.data_ptr(), static_cast<size_t>(pageRound(bytesOf(region))), advice);
}
// A region's pages leave this process's resident set.
void evict(const at::Tensor& region) { advise(region, MADV_DONTNEED); }
// The kernel reads a region's pages ahead of their use.
void prefetch(const at::Tensor& region) { advise(region, MADV_WILLNEED); }

// One file: regions handed out in order.
class DiskTier {
 public:
  DiskTier(const std::string& folder, int rank, int64_t bytes)
      : folder_(folder), size_(std::max<int64_t>(bytes, pageSize())) {
    std::error_code ec;
    fs::create_directories(folder, ec);
    const std::string path =
        (fs::path(folder) / ("rank" + std::to_string(rank) + "." + std::to_string(::getpid()) + ".bin")).string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) fail("cannot create " + path, errno);
    const int reserved = ::posix_fallocate(fd, 0, size_);
    if (reserved != 0) {
      ::close(fd);
      ::unlink(path.c_str());
      fail("cannot reserve " + std::to_string(size_ >> 20) + " MiB in " + path, reserved);
    }
    void* base = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int mapError = errno;
    ::close(fd);
    ::unlink(path.c_str());
    if (base == MAP_FAILED) fail("cannot map " + path, mapError);
    base_ = static_cast<char*>(base);
  }
  // The files were unlinked at once; the folders go too once empty (another
  // rank's tier may still be using them: then they stay for that one).
  ~DiskTier() {
    ::munmap(base_, static_cast<size_t>(size_));
    std::error_code ec;
    for (fs::path dir = folder_; !dir.empty() && fs::remove(dir, ec); dir = dir.parent_path()) {
      if (dir.filename() == "offload") break;
    }
  }
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // A new region shaped like `like` (dtype `dtype`), holding its values when
  // `copy`, zeros otherwise (a fresh file reads as zeros).
  at::Tensor place(const at::Tensor& like, at::ScalarType dtype, bool copy) {
    const int64_t bytes = like.numel() * static_cast<int64_t>(c10::elementSize(dtype));
    PTRAIN_CHECK(used_ + pageRound(bytes) <= size_, "offload: the disk tier's file is full (", size_, " bytes)");
    at::Tensor region = torch::from_blob(base_ + used_, like.sizes(), torch::TensorOptions().dtype(dtype));
    used_ += pageRound(bytes);
    if (copy) region.copy_(like.detach());
    evict(region);
    return region;
  }
  int64_t size() const { return size_; }

 private:
  [[noreturn]] static void fail(const std::string& what, int error) {
    throw ConfigError("offload (disk tier): " + what + ": " + std::strerror(error) +
                      "; choose a --run-dir on a file system with room, or turn offload off");
  }
  fs::path folder_;
  char* base_ = nullptr;
  int64_t size_ = 0;
  int64_t used_ = 0;
};

class DiskOffload final : public OffloadPlugin {
 public:
  explicit DiskOffload(const PluginContext& ctx) : ctx_(ctx) {}
  // The model may outlive the plugin (ModelRuntime::sharedModel()): its
  // parameters and gradients go back to ordinary memory before the file's
  // mapping does.
  ~DiskOffload() override {
    torch::NoGradGuard noGrad;
    for (auto& block : blocks_)
      for (auto& rp : block)
        if (rp.users == 0) rp.param.set_data(rp.region.clone());
    for (auto& slot : grads_) {
      if (slot.region.defined() && slot.param.grad().defined() &&
          slot.param.grad().data_ptr() == slot.region.data_ptr()) {
        slot.param.mutable_grad() = slot.region.clone();
      }
    }
  }

  void attachModel(StagedModel& model, const OffloadSettings& settings) override {
    settings_ = settings;
    torch::NoGradGuard noGrad;
    auto named = model.localParameters();
    std::vector<std::vector<at::Tensor>> blocks(static_cast<size_t>(model.numBlocks()));
    for (int b = 0; b < model.numBlocks(); ++b) {
      const std::string prefix = model.blockPrefix(b);
      for (const auto& [name, p] : named)
        if (name.rfind(prefix, 0) == 0) blocks[static_cast<size_t>(b)].push_back(p);
    }
    std::vector<at::Tensor> trained;
    for (const auto& [name, p] : named)
      if (p.requires_grad()) trained.push_back(p);
    // Bytes of every region, to reserve the file at once; gradients are
    // float32 or the parameter's dtype: room for float32.
    int64_t bytes = 0;
    if (settings.params)
      for (const auto& block : blocks)
        for (const auto& p : block) bytes += pageRound(bytesOf(p));
    if (settings.grads)
      for (const auto& p : trained) bytes += pageRound(p.numel() * std::max<int64_t>(4, p.element_size()));
    if (bytes == 0) return;
    blockParams_ = blocks;
    tiers_.push_back(std::make_unique<DiskTier>(settings.folder, ctx_.rank, bytes));
    DiskTier& tier = *tiers_.back();
    if (settings.params) {
      blocks_.resize(blocks.size());
      for (size_t b = 0; b < blocks.size(); ++b) {
        for (const auto& p : blocks[b]) {
          at::Tensor region = tier.place(p, p.scalar_type(), /*copy=*/true);
          p.set_data(region);
          blocks_[b].push_back(RestingParameter{p, region, 0});
          restingParam_[p.unsafeGetTensorImpl()] = region;
        }
      }
    }
    if (settings.grads) {
      gradTier_ = &tier;
      for (const auto& p : trained) grads_.push_back(GradSlot{p, at::Tensor()});
    }
    // The tensors that moved to the tier left their memory to the caching
    // allocator: give it back, or the resident set would keep their size.
    releaseCachedHostMemory();
  }

  void attachOptimizer(Optimizer& optimizer) override {
    optimizer_ = &optimizer;
    if (settings_.optimizer) {
      int64_t bytes = 0;
      for (size_t i = 0; i < optimizer.parameters().size(); ++i)
        for (const auto& t : optimizer.stateOf(i)) bytes += pageRound(bytesOf(t));
      if (bytes > 0) {
        tiers_.push_back(std::make_unique<DiskTier>(settings_.folder, ctx_.rank, bytes));
        DiskTier& tier = *tiers_.back();
        states_.resize(optimizer.parameters().size());
        for (size_t i = 0; i < optimizer.parameters().size(); ++i) {
          for (const auto& t : optimizer.stateOf(i)) {
            at::Tensor region = tier.place(t, t.scalar_type(), /*copy=*/true);
            t.set_data(region);
            states_[i].push_back(region);
          }
        }
        releaseCachedHostMemory();
      }
    }
    // The optimizer steps on the parameters, gradients and states at rest:
    // each leaves the resident set after its update (and the next is read
    // ahead).
    optimizer.update_observer = [this](size_t index, bool done) {
      if (!done) {
        prefetchUpdate(index + 1);
        return;
      }
      if (index < states_.size())
        for (const auto& region : states_[index]) evict(region);
      evictParameterAndGradient(optimizer_->parameters()[index]);
    };
    if (ctx_.rank == 0 && ctx_.logger) {
      ctx_.logger->info("offload: {}{}{}on disk, {:.1f} MiB mapped under {}", settings_.params ? "parameters " : "",
                        settings_.grads ? "gradients " : "", settings_.optimizer ? "optimizer states " : "",
                        static_cast<double>(fileBytes()) / (1 << 20), settings_.folder);
    }
  }

  void beginStep(const StepInfo&) override {
    inBytes_ = 0;
    if (!settings_.grads) return;
    torch::NoGradGuard noGrad;
    // Once (and again if a plugin replaced a gradient): the gradient becomes
    // its region, with the values it had (the precision plugin's float32
    // zeros, or nothing yet).
    for (auto& slot : grads_) {
      const at::Tensor& g = slot.param.grad();
      if (slot.region.defined() && g.defined() && g.data_ptr() == slot.region.data_ptr()) continue;
      const at::ScalarType dtype = g.defined() ? g.scalar_type() : slot.param.scalar_type();
      if (!slot.region.defined() || slot.region.scalar_type() != dtype) {
        slot.region = gradTier_->place(slot.param, dtype, /*copy=*/false);
      }
      if (g.defined()) slot.region.copy_(g);
      else slot.region.zero_();
      slot.param.mutable_grad() = slot.region;
      evict(slot.region);
      restingGrad_[slot.param.unsafeGetTensorImpl()] = slot.region;
    }
  }

  at::Tensor runBlock(int index, const at::Tensor& input, const BlockRunner& next) override {
    if (!settings_.params) return next(input);
    bringIn(index);
    prefetchBlock(index + 1);
    at::Tensor out = next(input);
    sendBack(index);
    return out;
  }

  bool observesBlockBackward() const override { return settings_.params || settings_.grads; }

  void beforeBlockBackward(int index) override {
    if (!settings_.params) return;
    bringIn(index);
    prefetchBlock(index - 1);
  }

  void afterBlockBackward(int index) override {
    if (settings_.params) sendBack(index);
    if (!settings_.grads || index < 0 || index >= static_cast<int>(blockParams_.size())) return;
    for (const auto& p : blockParams_[static_cast<size_t>(index)]) {
      auto it = restingGrad_.find(p.unsafeGetTensorImpl());
      if (it != restingGrad_.end()) evict(it->second);
    }
  }

  void finishGradients() override {
    for (const auto& [impl, region] : restingGrad_) evict(region);
  }

  // The global norm (and an overflow check) read every gradient just
  // before: out of the resident set again, until the optimizer reads each.
  bool mayStep(const GradientCheck&) override {
    for (const auto& [impl, region] : restingGrad_) evict(region);
    return true;
  }

  // The optimizer's zeroGrad() wrote every gradient.
  void afterStep(const StepResult&) override {
    for (const auto& [impl, region] : restingGrad_) evict(region);
  }

  std::map<std::string, double> stepStats() const override {
    return {{"offload_in_bytes", static_cast<double>(inBytes_)},
            {"offload_file_bytes", static_cast<double>(fileBytes())}};
  }

 private:
  struct GradSlot {
    at::Tensor param;
    at::Tensor region;
  };

  void bringIn(int index) {
    if (index < 0 || index >= static_cast<int>(blocks_.size())) return;
    torch::NoGradGuard noGrad;
    for (auto& rp : blocks_[static_cast<size_t>(index)]) {
      if (rp.users++ > 0) continue;
      at::Tensor working = torch::empty_like(rp.region);
      working.copy_(rp.region);
      rp.param.set_data(working);
      evict(rp.region);
      inBytes_ += bytesOf(working);
    }
  }

  void sendBack(int index) {
    if (index < 0 || index >= static_cast<int>(blocks_.size())) return;
    for (auto& rp : blocks_[static_cast<size_t>(index)]) {
      // Nothing writes a parameter while its block runs: the region still
      // holds its values.
      if (--rp.users == 0) rp.param.set_data(rp.region);
    }
  }

  void prefetchBlock(int index) {
    if (index < 0 || index >= static_cast<int>(blocks_.size())) return;
    for (const auto& rp : blocks_[static_cast<size_t>(index)]) prefetch(rp.region);
  }

  void prefetchUpdate(size_t index) {
    if (optimizer_ == nullptr || index >= optimizer_->parameters().size()) return;
    if (index < states_.size())
      for (const auto& region : states_[index]) prefetch(region);
    const at::Tensor& p = optimizer_->parameters()[index];
    if (auto it = restingParam_.find(p.unsafeGetTensorImpl()); it != restingParam_.end()) prefetch(it->second);
    if (auto it = restingGrad_.find(p.unsafeGetTensorImpl()); it != restingGrad_.end()) prefetch(it->second);
  }

  void evictParameterAndGradient(const at::Tensor& p) {
    if (auto it = restingParam_.find(p.unsafeGetTensorImpl()); it != restingParam_.end()) evict(it->second);
    if (auto it = restingGrad_.find(p.unsafeGetTensorImpl()); it != restingGrad_.end()) evict(it->second);
  }

  PluginContext ctx_;
  OffloadSettings settings_;
  int64_t fileBytes() const {
    int64_t total = 0;
    for (const auto& t : tiers_) total += t->size();
    return total;
  }

  std::vector<std::unique_ptr<DiskTier>> tiers_;  // one file per attach
  DiskTier* gradTier_ = nullptr;
  Optimizer* optimizer_ = nullptr;
  std::vector<std::vector<RestingParameter>> blocks_;  // offload.params
  std::vector<std::vector<at::Tensor>> blockParams_;   // each block's parameters, whatever is offloaded
  std::vector<GradSlot> grads_;
  std::vector<std::vector<at::Tensor>> states_;  // regions, per optimizer parameter
  std::map<const c10::TensorImpl*, at::Tensor> restingParam_, restingGrad_;
  int64_t inBytes_ = 0;
};

}  // namespace

std::unique_ptr<OffloadPlugin> makeDiskOffload(const PluginContext& ctx) { return std::make_unique<DiskOffload>(ctx); }

}  // namespace ptrain

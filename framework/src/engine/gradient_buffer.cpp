#include "ptrain/engine/gradient_buffer.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "ptrain/comm/communicator.h"
#include "ptrain/engine/placement.h"

namespace ptrain {
namespace {

bool isViewOf(const at::Tensor& grad, const at::Tensor& range) {
  return grad.defined() && range.defined() && grad.data_ptr() == range.data_ptr() &&
         grad.scalar_type() == range.scalar_type() && grad.device() == range.device() && grad.is_contiguous();
}

}  // namespace

GradientBuffer::GradientBuffer(const std::vector<std::pair<std::string, at::Tensor>>& named,
                               const Placement& placement, const LayoutGroups& groups, const Options& options)
    : options_(options) {
  torch::NoGradGuard noGrad;
  const bool scatter = options_.reduction == Reduction::kReduceScatter;
  // Trained parameters per reduce group, in registration order.
  std::map<GroupKind, std::vector<std::pair<std::string, at::Tensor>>> byGroup;
  for (const auto& [name, p] : named) {
    if (!p.requires_grad()) continue;
    const ParameterPlacement& place = placement.of(name);
    const GroupKind kind = Placement::gradientReduceGroup(place, groups.layout());
    const std::shared_ptr<ProcessGroup> group = groups.group(kind);
    if (options_.skip_single_member_groups && group->size() <= 1) continue;
    if (options_.skip_row_sparse && place.row_sparse_gradient && p.dim() == 2) {
      rowSparse_.emplace_back(p, group);
      continue;
    }
    byGroup[kind].emplace_back(name, p);
  }
  for (auto& [kind, params] : byGroup) {
    Set set;
    set.group = groups.group(kind);
    // The all-reduce packs from the last parameter, the reduce-scatter from
    // the first (its ranges are the distributed optimizer's, see the header).
    if (!scatter) std::reverse(params.begin(), params.end());
    int64_t used = 0;
    for (auto& [name, p] : params) {
      // The reduce-scatter's buckets are float32 whatever the parameters are.
      const int64_t bytes = p.numel() * (scatter ? int64_t{4} : static_cast<int64_t>(p.element_size()));
      if (set.buckets.empty() || used + bytes > options_.bucket_bytes) {
        set.buckets.emplace_back();
        set.buckets.back().group = set.group;
        used = 0;
      }
      Bucket& b = set.buckets.back();
      const int64_t offset = b.members.empty() ? 0 : b.members.back().offset + b.members.back().param.numel();
      b.members.push_back(Member{name, p, offset});
      b.partial = b.partial || placement.of(name).partial_gradient;
      used += bytes;
    }
    const int64_t size = set.group->size();
    for (Bucket& b : set.buckets) {
      const Member& last = b.members.back();
      const int64_t n = last.offset + last.param.numel();
      b.padded = scatter ? (n + size - 1) / size * size : n;
      b.shard = b.padded / size;
      if (scatter) {
        b.data = torch::zeros({b.padded},
                              torch::TensorOptions(at::kFloat).device(options_.device).requires_grad(false));
      }
    }
    // Launch order: backward makes the last parameters first.
    if (scatter) std::reverse(set.buckets.begin(), set.buckets.end());
    sets_.push_back(std::move(set));
  }
  nextToLaunch_.assign(sets_.size(), 0);
  for (size_t s = 0; s < sets_.size(); ++s) {
    for (size_t b = 0; b < sets_[s].buckets.size(); ++b) {
      for (const Member& m : sets_[s].buckets[b].members) hook(m.param, s, b);
    }
  }
}

GradientBuffer::~GradientBuffer() = default;

void GradientBuffer::hook(const at::Tensor& param, size_t set, size_t bucket) {
  auto acc = torch::autograd::impl::grad_accumulator(param);
  acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [this, set, bucket](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
        onReady(set, bucket);
        return outputs;
      }));
  // The parameter holds its accumulator only weakly: keep it alive, or a new
  // one without our hook would be made.
  accumulators_.push_back(std::make_shared<decltype(acc)>(std::move(acc)));
}

at::Tensor GradientBuffer::reducedRange(const Bucket& bucket) const {
  PTRAIN_CHECK(options_.reduction == Reduction::kReduceScatter, "GradientBuffer: reducedRange() of an all-reduce");
  return bucket.data.narrow(0, bucket.group->rank() * bucket.shard, bucket.shard);
}

void GradientBuffer::resetStep() {
  for (auto& set : sets_) {
    for (auto& b : set.buckets) {
      b.ready = 0;
      b.launched = b.launched_in_backward = false;
      b.work.reset();
    }
  }
  std::fill(nextToLaunch_.begin(), nextToLaunch_.end(), 0);
  inFlight_.clear();
  commBytes_ = overlappedBytes_ = 0;
}

void GradientBuffer::beforeBackward(int index, int count) {
  // Before the step's first backward pass, so that autograd accumulates into
  // the buffer from the start (no gradient of its own is ever allocated).
  if (index == 0) {
    for (auto& set : sets_)
      for (auto& b : set.buckets) adopt(b);
  }
  armed_ = options_.overlap && !sets_.empty() && index == count - 1;
  if (armed_) resetStep();
}

void GradientBuffer::adopt(Bucket& b) {
  torch::NoGradGuard noGrad;
  if (!b.data.defined() || options_.reduction == Reduction::kAllReduce) {
    // The all-reduce takes the gradients' dtype (float32 main gradients under
    // bf16 and fp16, which the precision plugin creates before backward).
    at::ScalarType dtype = b.members.front().param.scalar_type();
    for (const Member& m : b.members) {
      if (m.param.grad().defined()) {
        dtype = m.param.grad().scalar_type();
        break;
      }
    }
    if (!b.data.defined() || b.data.scalar_type() != dtype) {
      b.data = torch::zeros({b.padded}, torch::TensorOptions(dtype).device(options_.device).requires_grad(false));
    }
  }
  for (Member& m : b.members) {
    at::Tensor range = b.data.narrow(0, m.offset, m.param.numel());
    const at::Tensor& grad = m.param.grad();
    if (isViewOf(grad, range)) continue;  // backward accumulates into the buffer
    if (grad.defined()) range.copy_(grad.reshape({-1}));
    else range.zero_();
    // From now on backward accumulates into the buffer. A gradient on
    // another device or in another dtype (offload, a precision change) stays
    // where it is and is copied at each launch.
    if (options_.gradient_views && m.param.device() == range.device() &&
        (!grad.defined() || (grad.device() == range.device() && grad.scalar_type() == range.scalar_type()))) {
      m.param.mutable_grad() = range.view(m.param.sizes());
    }
  }
}

void GradientBuffer::onReady(size_t set, size_t bucket) {
  if (!armed_) return;
  ++sets_[set].buckets[bucket].ready;
  launchReady(set);
}

// Launches, in launch order, the buckets whose parameters are all ready. The
// reduce-scatter passes over partial buckets (finish() launches them after
// the plugins that complete them); every member passes over the same ones.
void GradientBuffer::launchReady(size_t s) {
  Set& set = sets_[s];
  const bool deferPartial = options_.reduction == Reduction::kReduceScatter;
  size_t& next = nextToLaunch_[s];
  while (next < set.buckets.size()) {
    Bucket& b = set.buckets[next];
    if (deferPartial && b.partial) {
      ++next;
      continue;
    }
    if (b.ready != static_cast<int>(b.members.size())) break;
    b.launched_in_backward = true;
    launch(s, next);
    ++next;
  }
}

void GradientBuffer::launch(size_t s, size_t index) {
  Bucket& b = sets_[s].buckets[index];
  adopt(b);  // a gradient replaced since beforeBackward is copied in
  b.launched = true;
  const int64_t bytes = b.data.numel() * static_cast<int64_t>(b.data.element_size());
  if (options_.reduction == Reduction::kAllReduce || options_.whole_sums) {
    b.work = b.group->allreduce(b.data);
  } else if (b.group->size() > 1) {
    at::Tensor out = b.data.narrow(0, b.group->rank() * b.shard, b.shard);
    b.work = b.group->reduceScatter(out, b.data);
    // Gloo's reduce-scatter (an all-to-all, then a local reduction) holds a
    // receive buffer of the bucket's size until it is waited for: on the
    // host, at most kHostScatterWindow of them are in flight, or a backward
    // that launches every bucket would hold a second copy of the gradients.
    // The oldest has most likely finished by now. (NCCL's is in place, and a
    // wait there would stall the compute stream behind it.)
    if (options_.device.is_cpu()) {
      inFlight_.push_back(&b);
      while (inFlight_.size() > kHostScatterWindow) {
        waitFor(*inFlight_.front());
        inFlight_.pop_front();
      }
    }
  }
  commBytes_ += b.group->size() > 1 ? bytes : 0;
  if (b.launched_in_backward) overlappedBytes_ += b.group->size() > 1 ? bytes : 0;
}

// A Work keeps its tensors (Gloo's receive buffer among them) until it is
// destroyed: it is dropped as soon as it has been waited for.
void GradientBuffer::waitFor(Bucket& b) {
  if (!b.work) return;
  b.work->wait();
  b.work.reset();
}

void GradientBuffer::finish(const std::function<void()>& whileInFlight) {
  torch::NoGradGuard noGrad;
  const auto start = std::chrono::steady_clock::now();
  if (!armed_) resetStep();
  // What backward did not launch, in launch order on every member: the
  // buckets of unused parameters (or all, without overlap) first, then the
  // partial ones, whose gradients the other plugins have completed by now.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t s = 0; s < sets_.size(); ++s) {
      for (size_t b = 0; b < sets_[s].buckets.size(); ++b) {
        Bucket& bucket = sets_[s].buckets[b];
        const bool deferred = options_.reduction == Reduction::kReduceScatter && bucket.partial;
        if (bucket.launched || deferred != (pass == 1)) continue;
        launch(s, b);
      }
    }
  }
  if (whileInFlight) whileInFlight();
  inFlight_.clear();
  for (auto& set : sets_) {
    for (auto& b : set.buckets) {
      waitFor(b);
      if (options_.reduction != Reduction::kAllReduce) continue;
      // Gradients that are not views of the buffer take their sums back.
      for (Member& m : b.members) {
        at::Tensor range = b.data.narrow(0, m.offset, m.param.numel());
        at::Tensor& grad = m.param.mutable_grad();
        if (!grad.defined()) grad = range.view(m.param.sizes()).clone();
        else if (!isViewOf(grad, range)) grad.copy_(range.view(m.param.sizes()));
      }
    }
  }
  armed_ = false;
  waitSeconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void GradientBuffer::zeroGradients() {
  torch::NoGradGuard noGrad;
  for (auto& set : sets_) {
    for (auto& b : set.buckets) {
      if (b.data.defined()) b.data.zero_();
      for (Member& m : b.members) {
        at::Tensor& grad = m.param.mutable_grad();
        if (grad.defined() && !(b.data.defined() && isViewOf(grad, b.data.narrow(0, m.offset, m.param.numel()))))
          grad.zero_();
      }
    }
  }
}

}  // namespace ptrain

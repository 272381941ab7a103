#include "stage_link.h"

#include <torch/torch.h>

#include <chrono>

#include "ptrain/core/phase_timer.h"

namespace ptrain::pipeline {
namespace {

constexpr int kMaxDims = 8;
constexpr int64_t kHeaderSize = 2 + kMaxDims;  // rank, dtype, sizes

using Clock = std::chrono::steady_clock;

// The tensor a shape header describes; throws InternalError when the header
// is not one (the two ends walked different schedules).
at::Tensor tensorFromHeader(const at::Tensor& header, at::Device device, int peer, int tag) {
  const int64_t* h = header.data_ptr<int64_t>();
  PTRAIN_CHECK(h[0] >= 0 && h[0] <= kMaxDims && h[1] >= 0 &&
                   h[1] < static_cast<int64_t>(at::ScalarType::NumOptions),
               "pipeline: malformed shape header from pipeline rank ", peer, " (tag ", tag,
               "): the stages are out of step");
  std::vector<int64_t> sizes(h + 2, h + 2 + h[0]);
  return torch::empty(sizes, torch::TensorOptions().dtype(static_cast<at::ScalarType>(h[1])).device(device));
}

}  // namespace

StageLink::StageLink(std::shared_ptr<ProcessGroup> group, int chunks, std::vector<std::vector<int>> blocks)
    : group_(std::move(group)), chunks_(chunks), blocks_(std::move(blocks)) {
  stages_ = group_->size();
  rank_ = group_->rank();
  PTRAIN_CHECK(static_cast<int>(blocks_.size()) == stages_ * chunks_, "pipeline: ", blocks_.size(),
               " virtual stages for ", stages_, " stages x ", chunks_, " chunks");
}

void StageLink::waitTimed(Work& work) {
  PhaseScope waiting(Phase::kPipelineWait);
  const auto start = Clock::now();
  work.wait();
  idle_ += std::chrono::duration<double>(Clock::now() - start).count();
}

void StageLink::send(const at::Tensor& t, int peer, int tag, bool withShape) {
  at::Tensor payload = t.contiguous();
  if (withShape) {
    PTRAIN_CHECK(payload.dim() <= kMaxDims, "pipeline: cannot send a tensor of ", payload.dim(), " dimensions");
    at::Tensor header = torch::zeros({kHeaderSize}, torch::kInt64);
    header[0] = payload.dim();
    header[1] = static_cast<int64_t>(payload.scalar_type());
    for (int64_t d = 0; d < payload.dim(); ++d) header[2 + d] = payload.size(d);
    pendingSends_.emplace_back(group_->send(header, peer, {tag}), header);
  }
  pendingSends_.emplace_back(group_->send(payload, peer, {tag}), payload);
}

at::Tensor StageLink::recv(int peer, int tag, const at::Tensor* like) {
  at::Tensor buffer;
  if (like != nullptr) {
    buffer = torch::empty(like->sizes(), like->options().requires_grad(false));
  } else {
    auto it = shapeOfTag_.find(tag);
    PTRAIN_CHECK(it != shapeOfTag_.end(), "pipeline: no shape known for messages with tag ", tag);
    buffer = torch::empty_like(it->second);
  }
  auto work = group_->recv(buffer, peer, {tag});
  waitTimed(*work);
  return buffer;
}

void StageLink::sendActivation(int toVirtual, const at::Tensor& t, bool withShape) {
  send(t, ownerOf(toVirtual), 2 * toVirtual, withShape);
}

at::Tensor StageLink::recvActivation(int atVirtual, bool withShape) {
  const int tag = 2 * atVirtual;
  const int peer = ownerOf(atVirtual - 1);
  if (withShape) {
    at::Tensor header = torch::empty({kHeaderSize}, torch::kInt64);
    auto work = group_->recv(header, peer, {tag});
    waitTimed(*work);
    shapeOfTag_[tag] = tensorFromHeader(header, device_, peer, tag);
  }
  return recv(peer, tag, nullptr);
}

void StageLink::sendGradient(int toVirtual, const at::Tensor& t) {
  send(t, ownerOf(toVirtual), 2 * toVirtual + 1, false);
}

at::Tensor StageLink::recvGradient(int atVirtual, const at::Tensor& like) {
  return recv(ownerOf(atVirtual + 1), 2 * atVirtual + 1, &like);
}

at::Tensor StageLink::exchangeWithOtherEnd(const at::Tensor& mine) {
  PTRAIN_CHECK(isFirstStage() || isLastStage(), "pipeline: only the first and the last stage exchange tied gradients");
  // Above every activation and gradient tag of training and inference.
  const int tag = 4 * stages_ * chunks_;
  const int peer = isFirstStage() ? stages_ - 1 : 0;
  send(mine, peer, tag, false);
  at::Tensor other = recv(peer, tag, &mine);
  waitSends();
  return other;
}

void StageLink::waitSends() {
  for (auto& [work, tensor] : pendingSends_) waitTimed(*work);
  pendingSends_.clear();
}

at::Tensor StageLink::forwardBlocks(StagedModel& model, const at::Tensor& embedded) {
  torch::NoGradGuard noGrad;
  // Inference tags sit above the training ones: 2 * (p v) + 2g.
  const int base = 2 * stages_ * chunks_;
  at::Tensor result;
  for (int chunk = 0; chunk < chunks_; ++chunk) {
    const int g = virtualStage(chunk);
    at::Tensor x;
    if (g == 0) {
      PTRAIN_CHECK(embedded.defined(), "pipeline: the first stage needs the embedded input");
      x = embedded;
    } else {
      const int tag = base + 2 * g;
      const int peer = ownerOf(g - 1);
      at::Tensor header = torch::empty({kHeaderSize}, torch::kInt64);
      waitTimed(*group_->recv(header, peer, {tag}));
      x = tensorFromHeader(header, device_, peer, tag);
      waitTimed(*group_->recv(x, peer, {tag}));
    }
    for (int block : blocksOf(g)) x = model.forwardBlock(block, x);
    if (g == lastVirtualStage()) {
      result = x;
    } else {
      send(x, ownerOf(g + 1), base + 2 * (g + 1), true);
    }
  }
  waitSends();
  return result;
}

void StageLink::broadcastFromLastStage(at::Tensor& tensor) {
  BroadcastOptions options;
  options.root = stages_ - 1;
  group_->broadcast(tensor, options)->wait();
}

}  // namespace ptrain::pipeline

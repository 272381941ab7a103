// StageLink: one rank's place in its pipeline and the point-to-point traffic
// between stages.
//
// Virtual stage g (chunk c of stage r, g = c * p + r) receives its input
// activation from the owner of g - 1 and its output gradient from the owner
// of g + 1. Each kind of message has its own tag (activations into g: 2g,
// gradients into g: 2g + 1, inference activations and the tied-gradient
// exchange above those), and Gloo delivers the messages of one tag between
// two ranks in order, so the sender and the receiver only have to walk the
// same schedule. Sends are asynchronous and kept until waitSends(); receives
// block, and the time they block is the stage's idle time.
//
// Shapes: a receiver learns a shape from a small header message (rank,
// dtype, sizes) sent before the tensor when the sender is asked to; training
// sends one with micro-batch 0 of each step (all micro-batches of a step
// share it), inference with every tensor.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/comm/process_group.h"
#include "ptrain/engine/model.h"

namespace ptrain::pipeline {

class StageLink final : public PipelineInference {
 public:
  // `blocks[g]`: the block indices of virtual stage g (p * v entries).
  StageLink(std::shared_ptr<ProcessGroup> group, int chunks, std::vector<std::vector<int>> blocks);

  int stages() const { return stages_; }
  int rank() const { return rank_; }
  int chunks() const { return chunks_; }
  int virtualStage(int chunk) const { return chunk * stages_ + rank_; }
  int lastVirtualStage() const { return stages_ * chunks_ - 1; }
  const std::vector<int>& blocksOf(int virtualStage) const { return blocks_[static_cast<size_t>(virtualStage)]; }
  ProcessGroup& group() { return *group_; }
  // Where received tensors are allocated (the model's device).
  void setDevice(at::Device device) { device_ = device; }

  // Training traffic. `withShape`: the receiver does not know the shape yet.
  void sendActivation(int toVirtual, const at::Tensor& t, bool withShape);
  at::Tensor recvActivation(int atVirtual, bool withShape);
  void sendGradient(int toVirtual, const at::Tensor& t);
  at::Tensor recvGradient(int atVirtual, const at::Tensor& like);
  // The tensor `mine` of the same shape on the first and the last stage,
  // exchanged between the two: returns the other stage's.
  at::Tensor exchangeWithOtherEnd(const at::Tensor& mine);
  // Waits for every send still in flight (their tensors are kept until then).
  void waitSends();

  // Seconds spent blocked in receives and waitSends() since the last reset.
  double idleSeconds() const { return idle_; }
  void resetIdle() { idle_ = 0; }

  // PipelineInference
  bool isFirstStage() const override { return rank_ == 0; }
  bool isLastStage() const override { return rank_ == stages_ - 1; }
  at::Tensor forwardBlocks(StagedModel& model, const at::Tensor& embedded) override;
  void broadcastFromLastStage(at::Tensor& tensor) override;

 private:
  int ownerOf(int virtualStage) const { return virtualStage % stages_; }
  void send(const at::Tensor& t, int peer, int tag, bool withShape);
  at::Tensor recv(int peer, int tag, const at::Tensor* like);
  void waitTimed(Work& work);

  std::shared_ptr<ProcessGroup> group_;
  int stages_ = 1, rank_ = 0, chunks_ = 1;
  std::vector<std::vector<int>> blocks_;
  std::vector<std::pair<std::shared_ptr<Work>, at::Tensor>> pendingSends_;
  std::map<int, at::Tensor> shapeOfTag_;  // last header received per tag: an empty tensor of that shape
  double idle_ = 0;
  at::Device device_{at::kCPU};
};

}  // namespace ptrain::pipeline

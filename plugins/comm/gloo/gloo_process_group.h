// GlooProcessGroup: ptrain's ProcessGroup over one c10d::ProcessGroupGloo.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "ptrain/comm/process_group.h"

namespace ptrain::gloo_backend {

// "1.5 s"
std::string formatSeconds(Timeout t);
// The one line of an exception a user needs: without c10's backtrace and
// without Gloo's "[file.cc:line] " prefix.
std::string reasonOf(const std::exception& e);

// What every error message of a group needs, shared by the group and the
// Work handles it returned (which may outlive it).
struct GroupState {
  std::string name;    // as given, e.g. "tp0"
  std::string label;   // for messages, e.g. "tp0[0,1]"
  std::vector<int> global_ranks;
  int rank = 0;
  int size = 1;
  Timeout timeout{0};
  // Set when Gloo timed out on this group: it closes the group's connections
  // then, so later operations cannot succeed.
  mutable std::atomic<bool> broken{false};

  // "allreduce on group tp0[0,1] (rank 1 of 2)"
  std::string where(const char* op) const;
  // Rethrows the current exception as CommError / TimeoutError naming op,
  // group and rank. `waited` is the timeout that applied.
  [[noreturn]] void rethrow(const char* op, Timeout waited) const;
};

// The handle of one operation: waits on c10d's Work, then runs `finish` (the
// local part of an operation: averaging, the reduction of a reduce-scatter)
// exactly once, on the thread that first sees the operation complete.
class GlooWork final : public Work {
 public:
  GlooWork(std::shared_ptr<GroupState> group, const char* op, c10::intrusive_ptr<c10d::Work> work, Timeout timeout,
           std::function<void()> finish);
  ~GlooWork() override;
  void wait(Timeout timeout) override;
  bool isCompleted() override;

 private:
  void finishLocked();

  std::shared_ptr<GroupState> group_;
  const char* op_;
  c10::intrusive_ptr<c10d::Work> work_;  // null: completed when issued
  Timeout timeout_;                      // the operation's own timeout; 0: the group's
  std::function<void()> finish_;
  std::mutex mutex_;
  bool done_ = false;
  std::exception_ptr error_;
};

class GlooProcessGroup final : public ProcessGroup {
 public:
  GlooProcessGroup(std::shared_ptr<GroupState> state, c10::intrusive_ptr<c10d::ProcessGroupGloo> pg);
  ~GlooProcessGroup() override;

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }
  const std::string& name() const override { return state_->name; }
  const std::vector<int>& globalRanks() const override { return state_->global_ranks; }
  Timeout timeout() const override { return state_->timeout; }
  bool supports(Capability capability) const override;

  std::shared_ptr<Work> allreduce(at::Tensor& tensor, const AllreduceOptions& opts) override;
  std::shared_ptr<Work> allgather(at::Tensor& output, const at::Tensor& input, Timeout timeout) override;
  std::shared_ptr<Work> reduceScatter(at::Tensor& output, const at::Tensor& input,
                                      const ReduceScatterOptions& opts) override;
  std::shared_ptr<Work> broadcast(at::Tensor& tensor, const BroadcastOptions& opts) override;
  std::shared_ptr<Work> allToAll(at::Tensor& output, const at::Tensor& input, const AllToAllOptions& opts) override;
  std::shared_ptr<Work> send(const at::Tensor& tensor, int peer, const PointToPointOptions& opts) override;
  std::shared_ptr<Work> recv(at::Tensor& tensor, int peer, const PointToPointOptions& opts) override;
  std::shared_ptr<Work> barrier(const BarrierOptions& opts) override;

 private:
  // Issues one c10d call, turning errors raised at issue time into ptrain's.
  std::shared_ptr<Work> issue(const char* op, Timeout timeout,
                              const std::function<c10::intrusive_ptr<c10d::Work>()>& call,
                              std::function<void()> finish = nullptr);
  std::shared_ptr<Work> done(const char* op);
  void checkUsable(const char* op) const;

  std::shared_ptr<GroupState> state_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

}  // namespace ptrain::gloo_backend

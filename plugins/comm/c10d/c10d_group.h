// What the comm plugins over libtorch's c10d share (comm/gloo, comm/nccl):
// ptrain's ProcessGroup over one c10d backend (ProcessGroupGloo or
// ProcessGroupNCCL), its Work handles, the translation of c10d's errors into
// CommError/TimeoutError naming the operation, group and rank, and group
// creation through the core's store. What differs between backends is data:
// BackendTraits.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <spdlog/logger.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "ptrain/comm/backend.h"
#include "ptrain/comm/process_group.h"
#include "ptrain/core/torch_compat.h"

namespace ptrain::c10d_group {

// What a backend moves and how; one constant per plugin.
struct BackendTraits {
  const char* name;                // "gloo", "nccl": in messages and store keys
  at::DeviceType device_type;      // where the tensors it moves live
  const char* device_hint;         // what to do with a tensor elsewhere
  bool (*reduces)(at::ScalarType);  // dtypes its reductions take
  const char* reducible_dtypes;    // the same, for messages
  bool native_avg;                 // c10d's ReduceOp::AVG; else sum, then divide locally
  bool native_reduce_scatter;      // c10d's _reduce_scatter_base; else all-to-all + local reduction
  // Complete zero-element collectives locally: Gloo 1.13 hangs on some.
  bool skip_empty;
  // wait() orders the caller's current stream after the operation and
  // returns without blocking the host (NCCL: the collective runs on its own
  // stream); the process's Watchdog (comm/watchdog.h) enforces the timeout,
  // aborting the communicator. Otherwise wait() blocks until the operation
  // completes or times out (Gloo).
  bool stream_ordered;
};

// "1.5 s"
std::string formatSeconds(Timeout t);
// The one line of an exception a user needs: without c10's backtrace and
// without Gloo's "[file.cc:line] " prefix.
std::string reasonOf(const std::exception& e);

// What every error message of a group needs, shared by the group and the
// Work handles it returned (which may outlive it).
struct GroupState {
  const BackendTraits* traits = nullptr;
  std::string name;    // as given, e.g. "tp0"
  std::string label;   // for messages, e.g. "tp0[0,1]"
  std::vector<int> global_ranks;
  int rank = 0;
  int size = 1;
  Timeout timeout{0};
  // Set when the group timed out or lost a peer: Gloo closes the group's
  // connections then, NCCL's communicator is aborted, so later operations
  // cannot succeed.
  mutable std::atomic<bool> broken{false};
  // Aborts the backend's communicator (NCCL); empty where closing is the
  // backend's own business (Gloo).
  std::function<void()> abort;
  // The TimeoutError of an operation the watchdog found stuck: every later
  // operation and wait on the group raises it.
  void fail(const std::string& message);
  std::string failure() const;
  // The timeout c10d itself is given for an operation whose ptrain timeout is
  // `t` (the group's when 0): a stream-ordered group leaves the deadline to
  // the watchdog, so c10d's own (which would report it differently) comes later.
  std::chrono::milliseconds c10dTimeout(Timeout t) const;

  // "allreduce on group tp0[0,1] (rank 1 of 2)"
  std::string where(const char* op) const;
  // Rethrows the current exception as CommError / TimeoutError naming op,
  // group and rank. `waited` is the timeout that applied.
  [[noreturn]] void rethrow(const char* op, Timeout waited) const;

 private:
  mutable std::mutex failure_mutex_;
  std::string failure_;
};

// The handle of one operation: waits on c10d's Work, then runs `finish` (the
// local part of an operation: averaging, the reduction of a reduce-scatter)
// exactly once, on the thread that first sees the operation complete.
class C10dWork final : public Work {
 public:
  C10dWork(std::shared_ptr<GroupState> group, const char* op, c10::intrusive_ptr<c10d::Work> work, Timeout timeout,
           std::function<void()> finish);
  ~C10dWork() override;
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

class C10dProcessGroup final : public ProcessGroup {
 public:
  C10dProcessGroup(std::shared_ptr<GroupState> state, c10::intrusive_ptr<compat::C10dBackend> pg);
  ~C10dProcessGroup() override;

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
  // Issues one c10d call, turning errors raised at issue time into ptrain's;
  // on a stream-ordered group the watchdog watches it from then on.
  std::shared_ptr<Work> issue(const char* op, Timeout timeout,
                              const std::function<c10::intrusive_ptr<c10d::Work>()>& call,
                              std::function<void()> finish = nullptr);
  std::shared_ptr<Work> done(const char* op);
  void checkUsable(const char* op) const;

  std::shared_ptr<GroupState> state_;
  c10::intrusive_ptr<compat::C10dBackend> pg_;
};

class StoreAdapter;

// A comm plugin over one c10d backend: validates the group options, gives
// each group its own store prefix ("<backend>/<group name>/<generation>"),
// and turns construction failures into ptrain's errors. A plugin supplies
// makeBackend.
class C10dCommBackend : public CommBackend {
 public:
  C10dCommBackend(const BackendTraits& traits, std::shared_ptr<spdlog::logger> logger);
  std::string backendName() const override { return traits_.name; }
  std::shared_ptr<ProcessGroup> createGroup(std::shared_ptr<Store> store, const GroupOptions& opts) override;

 protected:
  // The c10d backend of one group; may set state.abort.
  virtual c10::intrusive_ptr<compat::C10dBackend> makeBackend(const c10::intrusive_ptr<StoreAdapter>& store,
                                                              GroupState& state) = 0;
  // After a construction timeout: which members never arrived, as ": ..." (or "").
  virtual std::string missingMembers(Store& scoped, const GroupState& state) { return ""; }

  const BackendTraits& traits_;
  std::shared_ptr<spdlog::logger> logger_;

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, int> generations_;
};

// "tp0[0,1]"; long rank lists keep their ends: "world[0,1,2,...,63]".
std::string labelOf(const std::string& name, const std::vector<int>& ranks);

}  // namespace ptrain::c10d_group

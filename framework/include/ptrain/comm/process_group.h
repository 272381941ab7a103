// ProcessGroup and Work: the collectives every parallel plugin talks through.
//
// A ProcessGroup is a fixed set of ranks (the world, or one layout group such
// as this rank's tensor-parallel group). Every operation is asynchronous: it
// returns a Work handle whose wait() blocks until the result is in place, or
// throws CommError / TimeoutError naming the operation, the group and the rank.
// Operations on one group must be issued in the same order on every member.
//
// Tensors are CPU or device tensors as the backend supports (Gloo: CPU). They
// must stay alive and untouched until wait() returns.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain {

enum class ReduceOp { kSum, kAvg, kMax, kMin, kProduct };
PTRAIN_API const char* toString(ReduceOp op);

// Operations a backend may or may not implement natively.
enum class Capability { kAllToAllUneven, kSendRecv, kCuda };

// Zero means "the group's timeout" (communication.timeout_s).
using Timeout = std::chrono::milliseconds;
inline constexpr Timeout kUseGroupTimeout{0};

struct AllreduceOptions {
  ReduceOp op = ReduceOp::kSum;
  Timeout timeout = kUseGroupTimeout;
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  Timeout timeout = kUseGroupTimeout;
};
struct BroadcastOptions {
  int root = 0;  // rank within the group
  Timeout timeout = kUseGroupTimeout;
};
struct AllToAllOptions {
  // Rows (dim-0 slices) sent to / received from each group rank; empty means
  // equal splits. Sizes must agree pairwise across ranks.
  std::vector<int64_t> output_split_sizes;
  std::vector<int64_t> input_split_sizes;
  Timeout timeout = kUseGroupTimeout;
};
struct PointToPointOptions {
  int tag = 0;
  Timeout timeout = kUseGroupTimeout;
};
struct BarrierOptions {
  Timeout timeout = kUseGroupTimeout;
};

class PTRAIN_API Work {
 public:
  virtual ~Work();
  // Blocks until complete. Throws TimeoutError after `timeout` (group default
  // when zero), CommError when the operation failed.
  virtual void wait(Timeout timeout = kUseGroupTimeout) = 0;
  // Non-blocking: true when complete (successfully or not).
  virtual bool isCompleted() = 0;
};

class PTRAIN_API ProcessGroup {
 public:
  virtual ~ProcessGroup();

  // This process's rank within the group, and the group's size.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Name used in errors and logs, e.g. "tp[0,1]" or "world".
  virtual const std::string& name() const = 0;
  // Global ranks of the members, in group-rank order.
  virtual const std::vector<int>& globalRanks() const = 0;
  virtual Timeout timeout() const = 0;
  virtual bool supports(Capability capability) const { return false; }

  // In place: every member ends with the reduction of all members' tensors.
  virtual std::shared_ptr<Work> allreduce(at::Tensor& tensor, const AllreduceOptions& opts = {}) = 0;
  // `output` holds size() * input.numel() elements: member i's input lands in
  // the i-th dim-0 block (output has shape [size * input.size(0), ...]).
  virtual std::shared_ptr<Work> allgather(at::Tensor& output, const at::Tensor& input, Timeout timeout = kUseGroupTimeout) = 0;
  // `input` has size() dim-0 blocks; member i receives the reduction of every
  // member's i-th block in `output`.
  virtual std::shared_ptr<Work> reduceScatter(at::Tensor& output, const at::Tensor& input,
                                              const ReduceScatterOptions& opts = {}) = 0;
  virtual std::shared_ptr<Work> broadcast(at::Tensor& tensor, const BroadcastOptions& opts = {}) = 0;
  // Member i's j-th input block goes to member j's i-th output block.
  virtual std::shared_ptr<Work> allToAll(at::Tensor& output, const at::Tensor& input,
                                         const AllToAllOptions& opts = {}) = 0;
  // Point to point; `peer` is a group rank.
  virtual std::shared_ptr<Work> send(const at::Tensor& tensor, int peer, const PointToPointOptions& opts = {});
  virtual std::shared_ptr<Work> recv(at::Tensor& tensor, int peer, const PointToPointOptions& opts = {});
  virtual std::shared_ptr<Work> barrier(const BarrierOptions& opts = {}) = 0;

 protected:
  // For optional operations a backend lacks: throws CommError "backend X does not support Y".
  [[noreturn]] void unsupported(const char* op) const;
};

}  // namespace ptrain

// GradientBuffer: one contiguous gradient storage per reduction group, and the
// reductions that sum it over the data-parallel replicas while backward runs
// (Megatron-LM's distributed data-parallel grad buffer). The data plugin uses
// it to all-reduce; the distributed optimizer uses it to reduce-scatter.
//
// Layout. The trained parameters are grouped by the group that sums their
// gradients (Placement::gradientReduceGroup: dp for dense parameters, edp for
// experts) and laid end to end in buckets of about `bucket_bytes`. Each bucket
// owns one flat tensor, `data`; after a parameter's gradient first passes
// through the buffer, the parameter's gradient *is* its range of `data` (a
// view, installed before the first backward pass of each step where it is
// not one yet), so backward accumulates into the buffer and nothing is copied
// in or out. A gradient that someone replaced (a plugin assigning a new
// tensor), or that lives elsewhere (an offloaded gradient on the host), is
// copied into its range at launch and the sums are copied back at finish().
//
// Overlap. During the last backward pass of a step (beforeBackward with
// index == count - 1), a hook after each parameter's gradient accumulation
// marks it ready; a bucket whose parameters are all ready is launched at once,
// asynchronously, while backward goes on. Buckets are launched in a fixed
// order (the order backward produces them) that is the same on every member
// of the group, so every member issues the same collectives in the same order.
// A bucket that holds a parameter with a partial gradient
// (ParameterPlacement::partial_gradient: a plugin completes it in
// finishGradients, e.g. sequence-parallel LayerNorms, a tied embedding's two
// stages) is launched by the reduce-scatter only in finish(), after those
// plugins: the distributed optimizer sees only its range of the sums, so the
// other plugins' additions must be in before. The all-reduce launches it
// with the others: its sums are complete parameters again, which the other
// plugins then add up as they always have.
//
// Reductions:
//   kAllReduce      every member ends with the sums of every gradient. Buckets
//                   pack the parameters in reverse registration order (bucket
//                   0 holds the last parameters, the first backward makes).
//   kReduceScatter  a bucket is padded to a multiple of the group's size, and
//                   member r ends with the sums of the r-th equal range only,
//                   in place (reducedRange()). The buckets pack parameters in
//                   registration order, in float32, and launch last first; the
//                   distributed optimizer's ranges (and so its checkpoints)
//                   are these ranges.
//
// Row-sparse parameters (embedding tables, row_sparse_gradient) are not in
// the buffer when `skip_row_sparse` is set: the data plugin exchanges their
// touched rows instead.
//
// Thread-safety: one training thread per rank; the ready hooks run on the
// thread autograd runs them on, one at a time. Every member of a group calls
// beforeBackward/finish in the same order.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain {

class LayoutGroups;
class Placement;
class ProcessGroup;
class Work;

class PTRAIN_API GradientBuffer {
 public:
  enum class Reduction { kAllReduce, kReduceScatter };

  struct Options {
    Reduction reduction = Reduction::kAllReduce;
    int64_t bucket_bytes = 4 << 20;
    // Launch buckets from the ready hooks during the last backward pass;
    // false: every bucket launches in finish().
    bool overlap = true;
    // Where the buffers live and the collectives run (the model's device).
    at::Device device = at::Device(at::kCPU);
    // Make each parameter's gradient a view of the buffer. Off when an
    // offload plugin keeps gradients elsewhere (they are copied instead).
    bool gradient_views = true;
    // Leave row-sparse parameters out (the data plugin's gathered path);
    // otherwise they are reduced densely with the others.
    bool skip_row_sparse = false;
    // Leave out parameters whose group has one member (nothing to reduce);
    // the distributed optimizer keeps them (its ranges are then whole).
    bool skip_single_member_groups = true;
    // With kReduceScatter: keep its layout (padded float32 buckets, each
    // member's range), but give every member the whole bucket's sums (an
    // all-reduce). For device groups (parallel.groups), whose exchange needs
    // whole gradients before the distributed optimizer steps on its range.
    bool whole_sums = false;
  };

  struct Member {
    std::string name;
    at::Tensor param;
    int64_t offset = 0;  // in the bucket's data
  };

  struct Bucket {
    std::shared_ptr<ProcessGroup> group;
    std::vector<Member> members;
    int64_t padded = 0;        // elements of data (a multiple of the group's size for kReduceScatter)
    int64_t shard = 0;         // kReduceScatter: padded / group size
    bool partial = false;      // holds a parameter whose gradient a plugin completes later
    at::Tensor data;           // [padded]: the gradients, in their dtype (float32 for kReduceScatter)
    // Run-time state of the current step.
    int ready = 0;
    bool launched = false;
    bool launched_in_backward = false;
    std::shared_ptr<Work> work;
  };

  // `named`: this rank's parameters in registration order (those without
  // requires_grad are left out), placed by `placement` over `groups`. The
  // kReduceScatter buffers are allocated here; the kAllReduce ones at the
  // first launch, in the dtype the gradients then have (float32 main
  // gradients under bf16 and fp16).
  GradientBuffer(const std::vector<std::pair<std::string, at::Tensor>>& named, const Placement& placement,
                 const LayoutGroups& groups, const Options& options);
  ~GradientBuffer();
  GradientBuffer(const GradientBuffer&) = delete;
  GradientBuffer& operator=(const GradientBuffer&) = delete;

  // Per reduce group, its buckets in launch order.
  struct Set {
    std::shared_ptr<ProcessGroup> group;
    std::vector<Bucket> buckets;
  };
  const std::vector<Set>& sets() const { return sets_; }
  std::vector<Set>& sets() { return sets_; }
  bool empty() const { return sets_.empty(); }
  // The row-sparse parameters left out (skip_row_sparse), with their groups.
  const std::vector<std::pair<at::Tensor, std::shared_ptr<ProcessGroup>>>& rowSparse() const { return rowSparse_; }

  // kReduceScatter: this member's range of a bucket's sums ([shard] float32,
  // a view of its data), valid after finish().
  at::Tensor reducedRange(const Bucket& bucket) const;

  // The runtime's beforeBackward: arms the ready hooks for the last pass.
  void beforeBackward(int index, int count);
  // Launches every bucket not launched yet (unused parameters, partial
  // buckets, everything without overlap), optionally runs `whileInFlight`
  // (further collectives of the same members, e.g. the row exchange), waits
  // for every bucket and leaves the sums in the parameters' gradients
  // (kAllReduce) or in reducedRange() (kReduceScatter).
  void finish(const std::function<void()>& whileInFlight = nullptr);
  // Zeroes every gradient the buffer holds (the views in one pass).
  void zeroGradients();

  // Bytes the collectives of the last step moved (the buffers' sizes), and
  // those launched during backward.
  int64_t commBytes() const { return commBytes_; }
  int64_t overlappedBytes() const { return overlappedBytes_; }
  // Seconds finish() spent launching the rest and waiting.
  double waitSeconds() const { return waitSeconds_; }

 private:
  void hook(const at::Tensor& param, size_t set, size_t bucket);
  void onReady(size_t set, size_t bucket);
  void launchReady(size_t set);
  void launch(size_t set, size_t bucket);
  // Allocates the bucket's data if needed, copies in every gradient that is
  // not a view of it yet, and makes it one where it can.
  void adopt(Bucket& bucket);
  void waitFor(Bucket& bucket);
  void resetStep();

  Options options_;
  std::vector<Set> sets_;
  static constexpr size_t kHostScatterWindow = 2;
  std::deque<Bucket*> inFlight_;  // host reduce-scatters not waited for yet, oldest first
  std::vector<size_t> nextToLaunch_;  // per set: the next bucket in launch order not launched
  std::vector<std::pair<at::Tensor, std::shared_ptr<ProcessGroup>>> rowSparse_;
  bool armed_ = false;
  int64_t commBytes_ = 0;
  int64_t overlappedBytes_ = 0;
  double waitSeconds_ = 0;
  // The gradient accumulators our hooks hang on (a parameter holds its
  // accumulator only weakly). Type-erased: a shared_ptr in libtorch 1.13, an
  // intrusive_ptr later.
  std::vector<std::shared_ptr<void>> accumulators_;
};

}  // namespace ptrain

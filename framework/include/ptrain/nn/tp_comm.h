// Tensor-parallel communication as autograd functions (Megatron-LM's
// mappings), and the state a tensor-parallel layer runs with.
//
// Each function is an identity-like step in the model's dataflow whose
// forward and backward move data across the tensor-parallel group:
//
//   function                                forward                 backward
//   copyToTpRegion                          identity                all-reduce
//   reduceFromTpRegion                      all-reduce              identity
//   gatherFromTpRegion                      all-gather (last dim)   split (last dim)
//   scatterToTpRegion                       split (last dim)        all-gather (last dim)
//   gatherFromSequenceParallelRegion        all-gather (seq dim)    reduce-scatter (seq dim)
//   reduceScatterToSequenceParallelRegion   reduce-scatter (seq)    all-gather (seq dim)
//   scatterToSequenceParallelRegion         split (seq dim)         all-gather (seq dim)
//
// "split" keeps this rank's contiguous slice: rank r of n holds elements
// [r * k, (r + 1) * k) of a dimension of size n * k. ProcessGroup gathers and
// reduce-scatters dim-0 blocks, so these functions move the dimension they
// work on to the front, communicate, and move it back (one copy each way);
// models may keep their natural [batch, sequence, hidden] layout.
//
// With a state of size 1 every function returns its input unchanged and
// communicates nothing, so single-rank code paths stay exactly as they are.
//
// Throws: CommError / TimeoutError from the group when a collective fails or
// times out (naming the operation, group and rank); InternalError when a
// dimension to split is not divisible by the group size.
//
// Thread-safety: collectives on one group must be issued in the same order on
// every member, so one thread per rank runs the model (forward and backward).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"

namespace ptrain {
class ProcessGroup;
}

namespace ptrain::nn {

// What a tensor-parallel layer needs to know about its group. Created by the
// tensor plugin (or a test) and shared by every layer of a model through
// shared_ptr; a layer without one (null) runs on one rank.
//
// The communication functions keep a raw pointer to the state in the
// autograd graph they build: the state must outlive every graph (keep the
// model, which holds it, alive until backward has run).
struct PTRAIN_API TensorParallelState {
  TensorParallelState();
  ~TensorParallelState();
  TensorParallelState(const TensorParallelState&) = delete;
  TensorParallelState& operator=(const TensorParallelState&) = delete;

  // This rank's tensor-parallel group; rank and size within it.
  std::shared_ptr<ProcessGroup> group;
  int rank = 0;
  int size = 1;
  // Activations outside the tensor-parallel regions (LayerNorm, dropout,
  // residual) are split along the sequence dimension across the group.
  bool sequence_parallel = false;
  // Bytes of the tensors the functions of this header communicated: for an
  // all-reduce the tensor, for an all-gather the gathered output, for a
  // reduce-scatter the full input. The tensor plugin reports it per step.
  mutable std::atomic<int64_t> comm_bytes{0};

  // True when there is more than one rank to talk to.
  bool active() const { return size > 1; }

  // rank and size from `group`. Throws InternalError when group is null.
  static std::shared_ptr<TensorParallelState> create(std::shared_ptr<ProcessGroup> group, bool sequenceParallel);
};

// True when `state` is non-null and spans more than one rank.
inline bool isActive(const TensorParallelState* state) { return state != nullptr && state->active(); }

// ---- the tensor-parallel region (split hidden features) ----

// Forward identity; backward all-reduce (sum) of the gradient. Put before a
// column-parallel layer: each rank's input gradient is a partial sum.
PTRAIN_API at::Tensor copyToTpRegion(const at::Tensor& input, const TensorParallelState& tp);
// Forward all-reduce (sum); backward identity. After a row-parallel layer.
PTRAIN_API at::Tensor reduceFromTpRegion(const at::Tensor& input, const TensorParallelState& tp);
// Forward all-gather along the last dimension (rank order); backward keeps
// this rank's slice of the gradient.
PTRAIN_API at::Tensor gatherFromTpRegion(const at::Tensor& input, const TensorParallelState& tp);
// Forward keeps this rank's slice of the last dimension (which tp.size must
// divide, else InternalError); backward all-gathers the gradient.
PTRAIN_API at::Tensor scatterToTpRegion(const at::Tensor& input, const TensorParallelState& tp);

// ---- the sequence-parallel region (split sequence) ----
// `dim` is the sequence dimension of `input` (1 for [batch, sequence, hidden]).

// Forward all-gather of the sequence shards; backward reduce-scatter of the
// gradient when `outputGradIsPartial` (the gathered tensor feeds a
// tensor-parallel layer, whose input gradients are partial sums per rank),
// else a plain split (the gathered tensor is used identically on every rank).
PTRAIN_API at::Tensor gatherFromSequenceParallelRegion(const at::Tensor& input, const TensorParallelState& tp,
                                                       int64_t dim, bool outputGradIsPartial = true);
// Forward reduce-scatter (sum over ranks, keep this rank's sequence shard);
// backward all-gather. After a row-parallel layer under sequence parallelism.
PTRAIN_API at::Tensor reduceScatterToSequenceParallelRegion(const at::Tensor& input, const TensorParallelState& tp,
                                                            int64_t dim);
// Forward keeps this rank's sequence shard (tp.size must divide the
// dimension); backward all-gathers the gradient. Enters the sequence region
// from activations that are complete on every rank (the embeddings).
PTRAIN_API at::Tensor scatterToSequenceParallelRegion(const at::Tensor& input, const TensorParallelState& tp,
                                                      int64_t dim);

// ---- plain collectives (no autograd), counted in tp.comm_bytes ----

// Sum over the group; returns a new tensor.
PTRAIN_API at::Tensor allReduceSum(const at::Tensor& input, const TensorParallelState& tp);
// Concatenation of every rank's `input` along `dim`, in rank order.
PTRAIN_API at::Tensor allGatherAlong(const at::Tensor& input, const TensorParallelState& tp, int64_t dim);
// This rank's slice along `dim` of the sum over ranks.
PTRAIN_API at::Tensor reduceScatterAlong(const at::Tensor& input, const TensorParallelState& tp, int64_t dim);
// This rank's slice along `dim` (a copy).
PTRAIN_API at::Tensor splitAlong(const at::Tensor& input, const TensorParallelState& tp, int64_t dim);

}  // namespace ptrain::nn

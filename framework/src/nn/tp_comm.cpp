#include "ptrain/nn/tp_comm.h"

#include <torch/torch.h>

#include "ptrain/comm/process_group.h"

namespace ptrain::nn {

TensorParallelState::TensorParallelState() = default;
TensorParallelState::~TensorParallelState() = default;

std::shared_ptr<TensorParallelState> TensorParallelState::create(std::shared_ptr<ProcessGroup> group,
                                                                 bool sequenceParallel) {
  PTRAIN_CHECK(group != nullptr, "TensorParallelState::create: null group");
  auto state = std::make_shared<TensorParallelState>();
  state->rank = group->rank();
  state->size = group->size();
  state->group = std::move(group);
  state->sequence_parallel = sequenceParallel;
  return state;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t bytesOf(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

int64_t normDim(const at::Tensor& t, int64_t dim) {
  const int64_t d = dim < 0 ? dim + t.dim() : dim;
  PTRAIN_CHECK(d >= 0 && d < t.dim(), "tensor parallel: dimension ", dim, " out of range for a tensor of shape ",
               t.sizes());
  return d;
}

// IValue cannot hold an arbitrary C++ object, so the autograd context keeps
// the state's address; the state outlives the graph (see tp_comm.h).
void remember(AutogradContext* ctx, const TensorParallelState& tp, int64_t dim = 0, bool flag = false) {
  ctx->saved_data["tp"] = reinterpret_cast<int64_t>(&tp);
  ctx->saved_data["dim"] = dim;
  ctx->saved_data["flag"] = flag;
}
const TensorParallelState& stateOf(AutogradContext* ctx) {
  return *reinterpret_cast<const TensorParallelState*>(ctx->saved_data["tp"].toInt());
}
int64_t dimOf(AutogradContext* ctx) { return ctx->saved_data["dim"].toInt(); }
bool flagOf(AutogradContext* ctx) { return ctx->saved_data["flag"].toBool(); }

struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const TensorParallelState* tp) {
    remember(ctx, *tp);
    return input;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {allReduceSum(grads[0], stateOf(ctx)), at::Tensor()};
  }
};

struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const TensorParallelState* tp) {
    return allReduceSum(input, *tp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) { return {grads[0], at::Tensor()}; }
};

struct GatherFromTp : torch::autograd::Function<GatherFromTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const TensorParallelState* tp) {
    remember(ctx, *tp, input.dim() - 1);
    return allGatherAlong(input, *tp, input.dim() - 1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {splitAlong(grads[0], stateOf(ctx), dimOf(ctx)), at::Tensor()};
  }
};

struct ScatterToTp : torch::autograd::Function<ScatterToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const TensorParallelState* tp) {
    remember(ctx, *tp, input.dim() - 1);
    return splitAlong(input, *tp, input.dim() - 1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {allGatherAlong(grads[0], stateOf(ctx), dimOf(ctx)), at::Tensor()};
  }
};

struct GatherFromSp : torch::autograd::Function<GatherFromSp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const TensorParallelState* tp, int64_t dim,
                            bool outputGradIsPartial) {
    remember(ctx, *tp, dim, outputGradIsPartial);
    return allGatherAlong(input, *tp, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const TensorParallelState& tp = stateOf(ctx);
    at::Tensor g = flagOf(ctx) ? reduceScatterAlong(grads[0], tp, dimOf(ctx)) : splitAlong(grads[0], tp, dimOf(ctx));
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterToSp : torch::autograd::Function<ReduceScatterToSp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const TensorParallelState* tp, int64_t dim) {
    remember(ctx, *tp, dim);
    return reduceScatterAlong(input, *tp, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {allGatherAlong(grads[0], stateOf(ctx), dimOf(ctx)), at::Tensor(), at::Tensor()};
  }
};

struct ScatterToSp : torch::autograd::Function<ScatterToSp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const TensorParallelState* tp, int64_t dim) {
    remember(ctx, *tp, dim);
    return splitAlong(input, *tp, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {allGatherAlong(grads[0], stateOf(ctx), dimOf(ctx)), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor allReduceSum(const at::Tensor& input, const TensorParallelState& tp) {
  if (!tp.active()) return input;
  // A fresh buffer: the collective works in place, and autograd may still
  // need the input.
  at::Tensor out = input.detach().clone(at::MemoryFormat::Contiguous);
  tp.group->allreduce(out)->wait();
  tp.comm_bytes += bytesOf(out);
  return out;
}

at::Tensor allGatherAlong(const at::Tensor& input, const TensorParallelState& tp, int64_t dim) {
  if (!tp.active()) return input;
  const int64_t d = normDim(input, dim);
  at::Tensor front = input.detach().movedim(d, 0).contiguous();
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] *= tp.size;
  at::Tensor gathered = at::empty(shape, front.options());
  tp.group->allgather(gathered, front)->wait();
  tp.comm_bytes += bytesOf(gathered);
  return gathered.movedim(0, d).contiguous();
}

at::Tensor reduceScatterAlong(const at::Tensor& input, const TensorParallelState& tp, int64_t dim) {
  if (!tp.active()) return input;
  const int64_t d = normDim(input, dim);
  PTRAIN_CHECK(input.size(d) % tp.size == 0, "tensor parallel: reduce-scatter of size ", input.size(d),
               " along dim ", d, " over ", tp.size, " ranks");
  at::Tensor front = input.detach().movedim(d, 0).contiguous();
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] /= tp.size;
  at::Tensor out = at::empty(shape, front.options());
  tp.group->reduceScatter(out, front)->wait();
  tp.comm_bytes += bytesOf(front);
  return out.movedim(0, d).contiguous();
}

at::Tensor splitAlong(const at::Tensor& input, const TensorParallelState& tp, int64_t dim) {
  if (!tp.active()) return input;
  const int64_t d = normDim(input, dim);
  PTRAIN_CHECK(input.size(d) % tp.size == 0, "tensor parallel: cannot split size ", input.size(d), " along dim ", d,
               " over ", tp.size, " ranks");
  const int64_t chunk = input.size(d) / tp.size;
  return input.detach().narrow(d, tp.rank * chunk, chunk).clone(at::MemoryFormat::Contiguous);
}

at::Tensor copyToTpRegion(const at::Tensor& input, const TensorParallelState& tp) {
  if (!tp.active()) return input;
  return CopyToTp::apply(input, &tp);
}

at::Tensor reduceFromTpRegion(const at::Tensor& input, const TensorParallelState& tp) {
  if (!tp.active()) return input;
  return ReduceFromTp::apply(input, &tp);
}

at::Tensor gatherFromTpRegion(const at::Tensor& input, const TensorParallelState& tp) {
  if (!tp.active()) return input;
  return GatherFromTp::apply(input, &tp);
}

at::Tensor scatterToTpRegion(const at::Tensor& input, const TensorParallelState& tp) {
  if (!tp.active()) return input;
  return ScatterToTp::apply(input, &tp);
}

at::Tensor gatherFromSequenceParallelRegion(const at::Tensor& input, const TensorParallelState& tp, int64_t dim,
                                            bool outputGradIsPartial) {
  if (!tp.active()) return input;
  return GatherFromSp::apply(input, &tp, normDim(input, dim), outputGradIsPartial);
}

at::Tensor reduceScatterToSequenceParallelRegion(const at::Tensor& input, const TensorParallelState& tp, int64_t dim) {
  if (!tp.active()) return input;
  return ReduceScatterToSp::apply(input, &tp, normDim(input, dim));
}

at::Tensor scatterToSequenceParallelRegion(const at::Tensor& input, const TensorParallelState& tp, int64_t dim) {
  if (!tp.active()) return input;
  return ScatterToSp::apply(input, &tp, normDim(input, dim));
}

}  // namespace ptrain::nn

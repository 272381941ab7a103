#include "c10d_group.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

#include <c10/util/Exception.h>

#include "ptrain/comm/watchdog.h"
#include "ptrain/core/phase_timer.h"
#include "store_adapter.h"

namespace ptrain::c10d_group {
namespace {

bool contains(const std::string& text, const char* needle) { return text.find(needle) != std::string::npos; }

}  // namespace

std::string formatSeconds(Timeout t) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << static_cast<double>(t.count()) / 1000.0 << " s";
  return os.str();
}

std::string reasonOf(const std::exception& e) {
  std::string msg;
  if (const auto* c10err = dynamic_cast<const c10::Error*>(&e)) {
    msg = c10err->msg();
  } else {
    msg = e.what();
  }
  auto nl = msg.find('\n');
  if (nl != std::string::npos) msg.resize(nl);
  if (!msg.empty() && msg[0] == '[') {
    auto close = msg.find("] ");
    if (close != std::string::npos) msg = msg.substr(close + 2);
  }
  while (!msg.empty() && (msg.back() == ' ' || msg.back() == '.')) msg.pop_back();
  return msg;
}

namespace {

c10d::ReduceOp toC10d(ReduceOp op, const BackendTraits& traits) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kAvg:  // without a native average: sum, then divide locally
      return traits.native_avg ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    case ReduceOp::kProduct: return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}


// Integer averages truncate toward zero, as NCCL's ncclAvg does.
void divideInPlace(at::Tensor& t, int64_t n) {
  if (at::isFloatingType(t.scalar_type())) {
    t.div_(n);
  } else {
    t.div_(n, "trunc");
  }
}

}  // namespace

void GroupState::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (failure_.empty()) failure_ = message;
  }
  broken = true;
}

std::string GroupState::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

std::chrono::milliseconds GroupState::c10dTimeout(Timeout t) const {
  if (!traits->stream_ordered) return t.count() > 0 ? t : c10d::kUnsetTimeout;
  const Timeout mine = t.count() > 0 ? t : timeout;
  return mine * 2 + std::chrono::seconds(10);
}

std::string GroupState::where(const char* op) const {
  return detail::concat(op, " on group ", label, " (rank ", rank, " of ", size, ")");
}

void GroupState::rethrow(const char* op, Timeout waited) const {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string why = reasonOf(e);
    const std::string limit = detail::concat(
        formatSeconds(waited), waited == timeout ? " (communication.timeout_s)" : " (the operation's timeout)");
    if (contains(why, "Operation timed out")) {
      // c10d's wait gave up; the operation itself is still queued or running.
      throw TimeoutError(detail::concat(where(op), " timed out after ", limit, ": a peer is missing or stuck"));
    }
    if (contains(why, "Application timeout caused pair closure")) {
      broken = true;
      throw TimeoutError(detail::concat(where(op), " failed: an earlier operation on this group timed out and ",
                                        traits->name, " closed the group's connections; the group cannot be used again"));
    }
    if (contains(why, "Timed out") || contains(why, "timed out") || contains(why, "Timeout")) {
      broken = true;
      throw TimeoutError(detail::concat(where(op), " timed out after ", limit, ": a peer is missing or stuck (", why,
                                        ")"));
    }
    if (contains(why, "closed by peer") || contains(why, "reset by peer") || contains(why, "Broken pipe")) {
      broken = true;
      throw PeerFailedError(detail::concat(where(op), " failed: a peer closed its connection; did another rank exit? (",
                                     why, ")"));
    }
    throw CommError(detail::concat(where(op), " failed: ", why));
  } catch (...) {
    throw CommError(detail::concat(where(op), " failed with an unknown exception"));
  }
}

// ---------------------------------------------------------------- C10dWork

C10dWork::C10dWork(std::shared_ptr<GroupState> group, const char* op, c10::intrusive_ptr<c10d::Work> work,
                   Timeout timeout, std::function<void()> finish)
    : group_(std::move(group)), op_(op), work_(std::move(work)), timeout_(timeout), finish_(std::move(finish)) {}

C10dWork::~C10dWork() = default;

void C10dWork::wait(Timeout timeout) {
  ProfileRange range("wait", group_->name);
  const Timeout limit = timeout.count() > 0 ? timeout : (timeout_.count() > 0 ? timeout_ : group_->timeout);
  if (work_ && group_->traits->stream_ordered) {
    // The watchdog found this group stuck: its TimeoutError, not c10d's
    // report of the aborted communicator.
    const std::string failure = group_->failure();
    if (!failure.empty()) throw TimeoutError(failure);
    try {
      // No timeout: c10d then orders the current stream after the
      // collective's and returns; the host goes on queueing work.
      work_->wait();
    } catch (...) {
      const std::string late = group_->failure();
      if (!late.empty()) throw TimeoutError(late);
      group_->rethrow(op_, limit);
    }
  } else if (work_) {
    // c10d's Work is thread-safe and remembers its outcome, so waiting again
    // after a failure rethrows the same error.
    try {
      work_->wait(limit);
    } catch (...) {
      group_->rethrow(op_, limit);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  finishLocked();
}

bool C10dWork::isCompleted() {
  // c10d's point-to-point handles complete only inside wait() (Gloo has no
  // non-blocking test for them), so send/recv report false until waited on.
  if (work_ && !work_->isCompleted()) return false;
  if (work_ && !work_->isSuccess()) return true;
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return false;  // another thread is finishing it
  try {
    finishLocked();
  } catch (...) {
    // wait() reports it.
  }
  return true;
}

void C10dWork::finishLocked() {
  if (done_) {
    if (error_) std::rethrow_exception(error_);
    return;
  }
  done_ = true;
  if (!finish_) return;
  auto finish = std::move(finish_);
  finish_ = nullptr;  // drop the captured tensors
  try {
    finish();
  } catch (...) {
    try {
      group_->rethrow(op_, group_->timeout);
    } catch (...) {
      error_ = std::current_exception();
    }
    std::rethrow_exception(error_);
  }
}

// -------------------------------------------------------- C10dProcessGroup

namespace {

void checkTensor(const GroupState& g, const char* op, const at::Tensor& t, const char* what, bool anyDtype = false) {
  const BackendTraits& b = *g.traits;
  PTRAIN_CHECK_AS(CommError, t.defined(), g.where(op), ": ", what, " is an undefined tensor");
  PTRAIN_CHECK_AS(ConfigError, t.device().type() == b.device_type, g.where(op), ": ", what, " is on ", t.device(),
                  ", but the ", b.name, " backend moves ", c10::DeviceTypeName(b.device_type), " tensors only: ",
                  b.device_hint);
  PTRAIN_CHECK_AS(CommError, t.layout() == at::kStrided, g.where(op), ": ", what, " has layout ", t.layout(),
                  "; the ", b.name, " backend moves dense tensors only (use .to_dense())");
  PTRAIN_CHECK_AS(CommError, t.is_contiguous(), g.where(op), ": ", what, " is not contiguous (sizes ", t.sizes(),
                  ", strides ", t.strides(), "); pass a .contiguous() tensor and copy the result back");
  PTRAIN_CHECK_AS(ConfigError, anyDtype || b.reduces(t.scalar_type()), g.where(op), ": ", what, " has dtype ",
                  t.scalar_type(), "; the ", b.name, " backend reduces ", b.reducible_dtypes, " only: ",
                  "cast it (e.g. to float32) before communicating");
}

// A floating dtype the backend cannot reduce (bf16 on Gloo) is reduced as a
// float32 copy and rounded back once: the sum of the bf16 values, exactly as
// far as float32 holds it.
bool widens(const GroupState& g, const at::Tensor& t) {
  return t.defined() && at::isFloatingType(t.scalar_type()) && !g.traits->reduces(t.scalar_type()) &&
         g.traits->reduces(at::kFloat);
}

// Collectives that only move values (all-gather, all-to-all, broadcast) take
// a dtype the backend does not know as one of the same width it does (bf16
// as fp16 on Gloo): the bits travel unchanged.
at::Tensor movable(const GroupState& g, const at::Tensor& t) {
  if (!t.defined() || g.traits->reduces(t.scalar_type())) return t;
  for (at::ScalarType d : {at::kHalf, at::kFloat, at::kDouble, at::kByte, at::kChar, at::kInt, at::kLong}) {
    if (g.traits->reduces(d) && static_cast<int64_t>(c10::elementSize(d)) == static_cast<int64_t>(t.element_size())) return t.view(d);
  }
  return t;
}

void checkSameDtype(const GroupState& g, const char* op, const at::Tensor& a, const at::Tensor& b) {
  PTRAIN_CHECK_AS(CommError, a.scalar_type() == b.scalar_type(), g.where(op), ": output has dtype ", a.scalar_type(),
                  " but input has ", b.scalar_type());
}

int64_t rowNumel(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

// Validates a split list for `tensor` (dim-0 rows per group rank) and returns
// the rows for every rank; an empty list means equal splits.
std::vector<int64_t> resolveSplits(const GroupState& g, const char* op, const std::vector<int64_t>& splits,
                                   const at::Tensor& tensor, const char* what) {
  const int64_t rows = tensor.size(0);
  if (splits.empty()) {
    PTRAIN_CHECK_AS(CommError, rows % g.size == 0, g.where(op), ": ", what, " has ", rows,
                    " rows, which do not split equally over ", g.size, " ranks; pass ", what, "_split_sizes");
    return std::vector<int64_t>(static_cast<size_t>(g.size), rows / g.size);
  }
  PTRAIN_CHECK_AS(CommError, static_cast<int>(splits.size()) == g.size, g.where(op), ": ", what, "_split_sizes has ",
                  splits.size(), " entries, expected one per rank (", g.size, ")");
  int64_t total = 0;
  for (int64_t s : splits) {
    PTRAIN_CHECK_AS(CommError, s >= 0, g.where(op), ": ", what, "_split_sizes has a negative entry (", s, ")");
    total += s;
  }
  PTRAIN_CHECK_AS(CommError, total == rows, g.where(op), ": ", what, "_split_sizes add up to ", total, " rows but ",
                  what, " has ", rows);
  return splits;
}

}  // namespace

C10dProcessGroup::C10dProcessGroup(std::shared_ptr<GroupState> state, c10::intrusive_ptr<compat::C10dBackend> pg)
    : state_(std::move(state)), pg_(std::move(pg)) {}

// c10d's destructor drains the queued work first; every queued operation is
// bounded by the group's timeout (or, NCCL, aborted), so this cannot hang forever.
C10dProcessGroup::~C10dProcessGroup() = default;

bool C10dProcessGroup::supports(Capability capability) const {
  return capability == Capability::kAllToAllUneven || capability == Capability::kSendRecv;
}

void C10dProcessGroup::checkUsable(const char* op) const {
  if (state_->broken) {
    const std::string failure = state_->failure();
    if (!failure.empty()) throw TimeoutError(failure);
  }
  PTRAIN_CHECK_AS(CommError, !state_->broken, state_->where(op),
                  ": the group is unusable after an earlier timeout or a lost peer (", state_->traits->name,
                  " closes the group's connections then); see the first error");
}

std::shared_ptr<Work> C10dProcessGroup::issue(const char* op, Timeout timeout,
                                              const std::function<c10::intrusive_ptr<c10d::Work>()>& call,
                                              std::function<void()> finish) {
  checkUsable(op);
  ProfileRange range(op, state_->name);
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = call();
  } catch (...) {
    state_->rethrow(op, timeout.count() > 0 ? timeout : state_->timeout);
  }
  if (work && state_->traits->stream_ordered) {
    const Timeout limit = timeout.count() > 0 ? timeout : state_->timeout;
    std::weak_ptr<GroupState> weak = state_;
    Watchdog::instance().watch(
        [work] { return work->isCompleted(); },
        [weak, op, limit] {
          auto state = weak.lock();
          if (!state) return;
          // Recorded before the abort, so whoever the abort wakes finds the reason.
          state->fail(detail::concat(state->where(op), " timed out after ", formatSeconds(limit),
                                     limit == state->timeout ? " (communication.timeout_s)" : " (the operation's timeout)",
                                     ": a peer is missing or stuck; the ", state->traits->name,
                                     " communicator was aborted"));
          if (state->abort) state->abort();
        },
        Watchdog::Clock::now() + limit);
  }
  return std::make_shared<C10dWork>(state_, op, std::move(work), timeout, std::move(finish));
}

// Gloo 1.13 hangs on some zero-element collectives (allgather); with nothing
// to move, every member completes at once instead (BackendTraits::skip_empty).
// All members see the same element count, so they all skip together and stay
// in step.
std::shared_ptr<Work> C10dProcessGroup::done(const char* op) {
  checkUsable(op);
  return std::make_shared<C10dWork>(state_, op, c10::intrusive_ptr<c10d::Work>(), Timeout{0}, nullptr);
}

std::shared_ptr<Work> C10dProcessGroup::allreduce(at::Tensor& tensor, const AllreduceOptions& opts) {
  const char* op = "allreduce";
  const bool wide = widens(*state_, tensor);
  checkTensor(*state_, op, tensor, "tensor", /*anyDtype=*/wide);
  if (tensor.numel() == 0 && state_->traits->skip_empty) return done(op);
  // What the backend reduces: the tensor itself, or its float32 copy.
  at::Tensor reduced = wide ? tensor.to(at::kFloat) : tensor;
  std::function<void()> finish;
  const bool divide = opts.op == ReduceOp::kAvg && !state_->traits->native_avg;
  if (divide || wide) {
    finish = [t = tensor, reduced, divide, n = state_->size]() mutable {
      if (divide) divideInPlace(reduced, n);
      if (!t.is_same(reduced)) t.copy_(reduced);
    };
  }
  return issue(
      op, opts.timeout,
      [&] {
        c10d::AllreduceOptions o;
        o.reduceOp = toC10d(opts.op, *state_->traits);
        o.timeout = state_->c10dTimeout(opts.timeout);
        std::vector<at::Tensor> tensors{reduced};
        return pg_->allreduce(tensors, o);
      },
      std::move(finish));
}

std::shared_ptr<Work> C10dProcessGroup::allgather(at::Tensor& output, const at::Tensor& input, Timeout timeout) {
  const char* op = "allgather";
  checkTensor(*state_, op, input, "input", /*anyDtype=*/true);
  checkTensor(*state_, op, output, "output", /*anyDtype=*/true);
  checkSameDtype(*state_, op, output, input);
  const int64_t n = input.numel();
  PTRAIN_CHECK_AS(CommError, output.numel() == n * state_->size, state_->where(op), ": output has ", output.numel(),
                  " elements, expected group size x input elements = ", state_->size, " x ", n);
  if (n == 0 && state_->traits->skip_empty) return done(op);
  // From a megabyte on (below it the latency of one collective per member
  // costs more than the copies).
  constexpr int64_t kBroadcastGatherBytes = int64_t{1} << 20;
  if (!state_->traits->stream_ordered && output.is_contiguous() && input.is_contiguous() && output.device().is_cpu() &&
      output.numel() * static_cast<int64_t>(output.element_size()) >= kBroadcastGatherBytes) {
    // On the host, one broadcast per member straight into its block of the
    // output moves the same bytes per rank as c10d's all-gather, which
    // gathers into a freshly allocated flat buffer and copies it out again
    // (twice the output's size through memory, and a page fault every
    // 4 KiB of it). The member's own block comes from the input.
    at::Tensor flat = movable(*state_, output).view({-1});
    const int self = state_->rank;
    at::Tensor mine = flat.narrow(0, self * n, n);
    if (mine.data_ptr() != input.data_ptr()) mine.copy_(movable(*state_, input).reshape({-1}));
    auto earlier = std::make_shared<std::vector<c10::intrusive_ptr<c10d::Work>>>();
    auto finish = [earlier, flat, state = state_, op, timeout]() {
      // The last broadcast was waited for; the others ran before or beside it.
      const Timeout limit = timeout.count() > 0 ? timeout : state->timeout;
      for (auto& w : *earlier) w->wait(limit);
    };
    return issue(
        op, timeout,
        [&] {
          c10::intrusive_ptr<c10d::Work> last;
          for (int i = 0; i < state_->size; ++i) {
            if (last) earlier->push_back(last);
            c10d::BroadcastOptions o;
            o.rootRank = i;
            o.rootTensor = 0;
            o.timeout = state_->c10dTimeout(timeout);
            std::vector<at::Tensor> tensors{flat.narrow(0, i * n, n)};
            last = pg_->broadcast(tensors, o);
          }
          return last;
        },
        std::move(finish));
  }
  return issue(op, timeout, [&] {
    // Gloo gathers into one buffer per rank; views of the output's dim-0
    // blocks receive them without an extra allocation on our side.
    at::Tensor flat = movable(*state_, output).view({-1});
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int i = 0; i < state_->size; ++i) outputs[0].push_back(flat.narrow(0, i * n, n).view(input.sizes()));
    std::vector<at::Tensor> inputs{movable(*state_, input)};
    c10d::AllgatherOptions o;
    o.timeout = state_->c10dTimeout(timeout);
    return pg_->allgather(outputs, inputs, o);
  });
}

// c10d's ProcessGroupGloo in libtorch 1.13 has no reduce_scatter ("does not
// support reduce_scatter"); NCCL has its own (BackendTraits::native_reduce_scatter). An all-to-all followed by a local reduction
// moves the same bytes as a ring reduce-scatter: each rank sends (n-1)/n of
// its input and receives (n-1)/n of one input's worth; it then reduces the n
// blocks it holds, in rank order, so the result is deterministic.
std::shared_ptr<Work> C10dProcessGroup::reduceScatter(at::Tensor& output, const at::Tensor& input,
                                                      const ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  const bool wide = widens(*state_, input);
  checkTensor(*state_, op, input, "input", /*anyDtype=*/wide);
  checkTensor(*state_, op, output, "output", /*anyDtype=*/wide);
  checkSameDtype(*state_, op, output, input);
  const int64_t n = output.numel();
  const int size = state_->size;
  PTRAIN_CHECK_AS(CommError, input.numel() == n * size, state_->where(op), ": input has ", input.numel(),
                  " elements, expected group size x output elements = ", size, " x ", n);
  if (n == 0 && state_->traits->skip_empty) return done(op);
  if (state_->traits->native_reduce_scatter) {
    return issue(op, opts.timeout, [&] {
      at::Tensor out = output.view({-1});
      at::Tensor in = input.view({-1});
      c10d::ReduceScatterOptions o;
      o.reduceOp = toC10d(opts.op, *state_->traits);
      o.timeout = state_->c10dTimeout(opts.timeout);
      return pg_->_reduce_scatter_base(out, in, o);
    });
  }
  at::Tensor received = at::empty({input.numel()}, input.options());
  auto finish = [received, out = output, size, reduce = opts.op, wide]() mutable {
    // A dtype the backend cannot reduce is summed in float32, as allreduce does.
    at::Tensor blocks = wide ? received.view({size, -1}).to(at::kFloat) : received.view({size, -1});
    at::Tensor flat = wide ? at::empty({out.numel()}, blocks.options()) : out.view({-1});
    flat.copy_(blocks[0]);
    for (int j = 1; j < size; ++j) {
      at::Tensor block = blocks[j];
      switch (reduce) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg: flat.add_(block); break;
        case ReduceOp::kMax: at::maximum_out(flat, flat, block); break;
        case ReduceOp::kMin: at::minimum_out(flat, flat, block); break;
        case ReduceOp::kProduct: flat.mul_(block); break;
      }
    }
    if (reduce == ReduceOp::kAvg) divideInPlace(flat, size);
    if (wide) out.view({-1}).copy_(flat);
  };
  return issue(
      op, opts.timeout,
      [&] {
        at::Tensor in = movable(*state_, input).view({-1});
        at::Tensor into = movable(*state_, received);
        std::vector<int64_t> equal;  // empty: equal splits
        c10d::AllToAllOptions o;
        o.timeout = state_->c10dTimeout(opts.timeout);
        return pg_->alltoall_base(into, in, equal, equal, o);
      },
      std::move(finish));
}

std::shared_ptr<Work> C10dProcessGroup::broadcast(at::Tensor& tensor, const BroadcastOptions& opts) {
  const char* op = "broadcast";
  checkTensor(*state_, op, tensor, "tensor", /*anyDtype=*/true);
  PTRAIN_CHECK_AS(CommError, opts.root >= 0 && opts.root < state_->size, state_->where(op), ": root ", opts.root,
                  " is not a rank of this group (ranks 0..", state_->size - 1, ")");
  if (tensor.numel() == 0 && state_->traits->skip_empty) return done(op);
  return issue(op, opts.timeout, [&] {
    c10d::BroadcastOptions o;
    o.rootRank = opts.root;
    o.rootTensor = 0;
    o.timeout = state_->c10dTimeout(opts.timeout);
    std::vector<at::Tensor> tensors{movable(*state_, tensor)};
    return pg_->broadcast(tensors, o);
  });
}

std::shared_ptr<Work> C10dProcessGroup::allToAll(at::Tensor& output, const at::Tensor& input,
                                                 const AllToAllOptions& opts) {
  const char* op = "all_to_all";
  checkTensor(*state_, op, input, "input", /*anyDtype=*/true);
  checkTensor(*state_, op, output, "output", /*anyDtype=*/true);
  checkSameDtype(*state_, op, output, input);
  PTRAIN_CHECK_AS(CommError, input.dim() >= 1 && output.dim() >= 1, state_->where(op),
                  ": input and output need at least one dimension (rows are split over ranks)");
  PTRAIN_CHECK_AS(CommError, rowNumel(input) == rowNumel(output), state_->where(op), ": input rows have ",
                  rowNumel(input), " elements but output rows have ", rowNumel(output));
  auto inSplits = resolveSplits(*state_, op, opts.input_split_sizes, input, "input");
  auto outSplits = resolveSplits(*state_, op, opts.output_split_sizes, output, "output");
  const int me = state_->rank;
  PTRAIN_CHECK_AS(CommError, inSplits[me] == outSplits[me], state_->where(op), ": sends ", inSplits[me],
                  " rows to itself but expects to receive ", outSplits[me], " from itself");
  // Zero-element exchanges are not skipped: only this rank's side is empty,
  // its peers still take part.
  return issue(op, opts.timeout, [&] {
    at::Tensor in = movable(*state_, input);
    at::Tensor out = movable(*state_, output);
    std::vector<int64_t> outCounts = opts.output_split_sizes;
    std::vector<int64_t> inCounts = opts.input_split_sizes;
    c10d::AllToAllOptions o;
    o.timeout = state_->c10dTimeout(opts.timeout);
    return pg_->alltoall_base(out, in, outCounts, inCounts, o);
  });
}

std::shared_ptr<Work> C10dProcessGroup::send(const at::Tensor& tensor, int peer, const PointToPointOptions& opts) {
  const char* op = "send";
  checkTensor(*state_, op, tensor, "tensor", /*anyDtype=*/true);
  PTRAIN_CHECK_AS(CommError, peer >= 0 && peer < state_->size && peer != state_->rank, state_->where(op), ": peer ",
                  peer, " must be another rank of this group (ranks 0..", state_->size - 1, ")");
  PTRAIN_CHECK_AS(CommError, opts.tag >= 0, state_->where(op), ": tag ", opts.tag, " must be non-negative");
  return issue(op, opts.timeout, [&] {
    std::vector<at::Tensor> tensors{tensor};
    return pg_->send(tensors, peer, opts.tag);
  });
}

std::shared_ptr<Work> C10dProcessGroup::recv(at::Tensor& tensor, int peer, const PointToPointOptions& opts) {
  const char* op = "recv";
  checkTensor(*state_, op, tensor, "tensor", /*anyDtype=*/true);
  PTRAIN_CHECK_AS(CommError, peer >= 0 && peer < state_->size && peer != state_->rank, state_->where(op), ": peer ",
                  peer, " must be another rank of this group (ranks 0..", state_->size - 1, ")");
  PTRAIN_CHECK_AS(CommError, opts.tag >= 0, state_->where(op), ": tag ", opts.tag, " must be non-negative");
  return issue(op, opts.timeout, [&] {
    std::vector<at::Tensor> tensors{tensor};
    return pg_->recv(tensors, peer, opts.tag);
  });
}

std::shared_ptr<Work> C10dProcessGroup::barrier(const BarrierOptions& opts) {
  return issue("barrier", opts.timeout, [&] {
    c10d::BarrierOptions o;
    o.timeout = state_->c10dTimeout(opts.timeout);
    return pg_->barrier(o);
  });
}

// ---------------------------------------------------------- C10dCommBackend

std::string labelOf(const std::string& name, const std::vector<int>& ranks) {
  if (name.find('[') != std::string::npos) return name;
  std::ostringstream os;
  os << name << "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks.size() > 8 && i == 3) {
      os << "...," << ranks.back();
      break;
    }
    if (i) os << ",";
    os << ranks[i];
  }
  os << "]";
  return os.str();
}

C10dCommBackend::C10dCommBackend(const BackendTraits& traits, std::shared_ptr<spdlog::logger> logger)
    : traits_(traits), logger_(std::move(logger)) {}

std::shared_ptr<ProcessGroup> C10dCommBackend::createGroup(std::shared_ptr<Store> store, const GroupOptions& opts) {
  const char* backend = traits_.name;
  PTRAIN_CHECK(store != nullptr, backend, " createGroup(", opts.name, "): store is null");
  PTRAIN_CHECK_AS(ConfigError, !opts.name.empty(), backend, ": a process group needs a name (used as store prefix)");
  PTRAIN_CHECK_AS(ConfigError, !opts.ranks.empty(), backend, ": group ", opts.name, " has no ranks");
  PTRAIN_CHECK_AS(ConfigError, opts.timeout.count() > 0, backend, ": group ", opts.name,
                  " needs a positive timeout (communication.timeout_s)");
  for (size_t i = 1; i < opts.ranks.size(); ++i) {
    PTRAIN_CHECK_AS(ConfigError, opts.ranks[i - 1] < opts.ranks[i], backend, ": the ranks of group ",
                    labelOf(opts.name, opts.ranks), " must be sorted and distinct");
  }
  auto it = std::find(opts.ranks.begin(), opts.ranks.end(), opts.global_rank);
  PTRAIN_CHECK_AS(ConfigError, it != opts.ranks.end(), backend, ": rank ", opts.global_rank,
                  " is not a member of group ", labelOf(opts.name, opts.ranks), "; only members create a group");

  auto state = std::make_shared<GroupState>();
  state->traits = &traits_;
  state->name = opts.name;
  state->label = labelOf(opts.name, opts.ranks);
  state->global_ranks = opts.ranks;
  state->rank = static_cast<int>(it - opts.ranks.begin());
  state->size = static_cast<int>(opts.ranks.size());
  state->timeout = opts.timeout;

  // A name may be reused (a group torn down and made again); members create
  // groups in the same order, so counting per name keeps their keys apart
  // from the stale ones of the earlier group.
  int generation = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation = generations_[opts.name]++;
  }
  auto scoped = prefixStore(store, detail::concat(backend, "/", opts.name, "/", generation));
  auto adapter = c10::make_intrusive<StoreAdapter>(scoped, opts.timeout);

  const std::string where =
      detail::concat("creating group ", state->label, " (rank ", state->rank, " of ", state->size, ")");
  c10::intrusive_ptr<compat::C10dBackend> pg;
  try {
    pg = makeBackend(adapter, *state);
  } catch (const TimeoutError&) {
    throw TimeoutError(detail::concat(where, " timed out after ", formatSeconds(opts.timeout),
                                      " (communication.timeout_s)", missingMembers(*scoped, *state)));
  } catch (const Error& e) {
    throw CommError(detail::concat(where, " failed: ", e.what()));
  } catch (const std::exception& e) {
    std::string why = reasonOf(e);
    if (why.find("imeout") != std::string::npos || why.find("imed out") != std::string::npos) {
      throw TimeoutError(detail::concat(where, " timed out after ", formatSeconds(opts.timeout),
                                        " (communication.timeout_s)", missingMembers(*scoped, *state), " (", why,
                                        ")"));
    }
    throw CommError(detail::concat(where, " failed: ", why));
  }
  if (logger_) logger_->debug("{}: joined group {} as rank {} of {}", backend, state->label, state->rank, state->size);
  return std::make_shared<C10dProcessGroup>(std::move(state), std::move(pg));
}

}  // namespace ptrain::c10d_group

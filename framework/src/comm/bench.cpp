#include "ptrain/comm/bench.h"

#include <algorithm>
#include <chrono>

#include <ATen/ATen.h>

#include "ptrain/core/device.h"

namespace ptrain {
namespace {

using Clock = std::chrono::steady_clock;

at::ScalarType parseDtype(const std::string& dtype) {
  if (dtype == "float32") return at::kFloat;
  if (dtype == "float64") return at::kDouble;
  if (dtype == "int32") return at::kInt;
  if (dtype == "int64") return at::kLong;
  throw ConfigError(
      detail::concat("--dtype: '", dtype, "' is not a benchmark dtype; use float32, float64, int32 or int64"));
}

bool splitsOverRanks(const std::string& op) {
  return op == "allgather" || op == "reduce_scatter" || op == "all_to_all";
}

// The element count of a `bytes` buffer for `op`: rounded down to a multiple
// of the group size where the buffer splits into one block per rank, and
// never empty.
int64_t countFor(const std::string& op, int64_t bytes, int64_t elementSize, int n) {
  int64_t count = std::max<int64_t>(1, bytes / elementSize);
  if (splitsOverRanks(op)) count = std::max<int64_t>(n, count / n * n);
  return count;
}

// One collective at one size: buffers, the operation, and its exact check.
// Contributions are small integers, exact in every benchmark dtype.
struct Case {
  std::function<void()> run;        // issue and wait for one operation
  std::function<void()> fill;       // known contributions for the check
  std::function<int64_t()> wrong;   // elements differing from the closed form
};

Case makeCase(ProcessGroup& g, const std::string& op, int64_t count, at::ScalarType dtype, const std::string& device) {
  const int n = g.size();
  const int r = g.rank();
  const auto opts = at::TensorOptions().dtype(dtype).device(at::Device(device));
  auto differing = [](const at::Tensor& got, const at::Tensor& expected) {
    return got.reshape({-1}).cpu().ne(expected.reshape({-1})).sum().item<int64_t>();
  };
  Case c;
  if (op == "allreduce") {
    at::Tensor t = at::zeros({count}, opts);
    c.run = [&g, t]() mutable { g.allreduce(t)->wait(); };
    c.fill = [t, r, count]() mutable { t.copy_((r + 1) + at::arange(count, at::kLong).remainder(7)); };
    c.wrong = [t, n, count, differing] {
      return differing(t, (n * (n + 1) / 2 + n * at::arange(count, at::kLong).remainder(7)).to(t.scalar_type()));
    };
  } else if (op == "allgather") {
    const int64_t m = count / n;
    at::Tensor in = at::zeros({m}, opts), out = at::zeros({count}, opts);
    c.run = [&g, in, out]() mutable { g.allgather(out, in)->wait(); };
    c.fill = [in, r, m]() mutable { in.copy_(r * 1000 + at::arange(m, at::kLong).remainder(1000)); };
    c.wrong = [out, n, m, differing] {
      at::Tensor f = at::arange(n * m, at::kLong);
      return differing(out, (f.div(m, "floor") * 1000 + f.remainder(m).remainder(1000)).to(out.scalar_type()));
    };
  } else if (op == "reduce_scatter") {
    const int64_t m = count / n;
    at::Tensor in = at::zeros({count}, opts), out = at::zeros({m}, opts);
    c.run = [&g, in, out]() mutable { g.reduceScatter(out, in)->wait(); };
    c.fill = [in, r, count]() mutable { in.copy_((r + 1) + at::arange(count, at::kLong).remainder(7)); };
    c.wrong = [out, n, r, m, differing] {
      at::Tensor f = at::arange(r * m, (r + 1) * m, at::kLong);
      return differing(out, (n * (n + 1) / 2 + n * f.remainder(7)).to(out.scalar_type()));
    };
  } else if (op == "broadcast") {
    at::Tensor t = at::zeros({count}, opts);
    c.run = [&g, t]() mutable { g.broadcast(t)->wait(); };
    c.fill = [t, r, count]() mutable {
      if (r == 0) t.copy_(1 + at::arange(count, at::kLong).remainder(1000));
      else t.fill_(0);
    };
    c.wrong = [t, count, differing] {
      return differing(t, (1 + at::arange(count, at::kLong).remainder(1000)).to(t.scalar_type()));
    };
  } else if (op == "all_to_all") {
    const int64_t m = count / n;
    at::Tensor in = at::zeros({count}, opts), out = at::zeros({count}, opts);
    c.run = [&g, in, out]() mutable { g.allToAll(out, in)->wait(); };
    // Block j of rank r's input carries (r n + j); block j of its output
    // must carry (j n + r), the sender's index first.
    c.fill = [in, r, n, m, count]() mutable {
      at::Tensor f = at::arange(count, at::kLong);
      in.copy_((r * n + f.div(m, "floor")) * 8 + f.remainder(m).remainder(8));
    };
    c.wrong = [out, r, n, m, count, differing] {
      at::Tensor f = at::arange(count, at::kLong);
      return differing(out, ((f.div(m, "floor") * n + r) * 8 + f.remainder(m).remainder(8)).to(out.scalar_type()));
    };
  } else if (op == "sendrecv") {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    at::Tensor out = at::zeros({count}, opts), in = at::zeros({count}, opts);
    c.run = [&g, out, in, next, prev]() mutable {
      auto s = g.send(out, next);
      auto v = g.recv(in, prev);
      v->wait();
      s->wait();
    };
    c.fill = [out, r, count]() mutable { out.copy_(r * 1000 + at::arange(count, at::kLong).remainder(1000)); };
    c.wrong = [in, prev, count, differing] {
      return differing(in, (prev * 1000 + at::arange(count, at::kLong).remainder(1000)).to(in.scalar_type()));
    };
  } else if (op == "barrier") {
    c.run = [&g] { g.barrier()->wait(); };
    c.fill = [] {};
    c.wrong = [] { return int64_t{0}; };
  } else {
    throw InternalError(detail::concat("bench-comm: no case for op ", op));
  }
  return c;
}

// The slowest rank's time and the total wrong count, agreed by every rank.
// On the device the collectives ran on (NCCL moves device tensors only).
std::pair<double, int64_t> agree(ProcessGroup& g, double seconds, int64_t wrong, at::Device device) {
  at::Tensor t = at::full({1}, seconds, at::TensorOptions().dtype(at::kDouble).device(device));
  AllreduceOptions maxOpts;
  maxOpts.op = ReduceOp::kMax;
  g.allreduce(t, maxOpts)->wait();
  at::Tensor w = at::full({1}, wrong, at::TensorOptions().dtype(at::kLong).device(device));
  g.allreduce(w)->wait();
  return {t.item<double>(), w.item<int64_t>()};
}

}  // namespace

const std::vector<std::string>& commBenchOps() {
  static const std::vector<std::string> ops{"allreduce",  "allgather", "reduce_scatter", "broadcast",
                                            "all_to_all", "sendrecv",  "barrier"};
  return ops;
}

double commBenchBusFactor(const std::string& op, int groupSize) {
  const double n = groupSize;
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "allgather" || op == "reduce_scatter" || op == "all_to_all") return (n - 1) / n;
  if (op == "broadcast" || op == "sendrecv") return 1.0;
  return 0.0;  // barrier moves no payload
}

void validateCommBenchOptions(const CommBenchOptions& o) {
  const auto& known = commBenchOps();
  for (const auto& op : o.ops) {
    if (std::find(known.begin(), known.end(), op) == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      throw ConfigError(detail::concat("--ops: unknown collective '", op, "'; choose from ", list));
    }
  }
  PTRAIN_CHECK_AS(ConfigError, o.min_bytes > 0, "--min-bytes must be positive, got ", o.min_bytes);
  PTRAIN_CHECK_AS(ConfigError, o.max_bytes >= o.min_bytes, "--max-bytes (", o.max_bytes,
                  ") is smaller than --min-bytes (", o.min_bytes, ")");
  PTRAIN_CHECK_AS(ConfigError, o.max_bytes <= (int64_t{1} << 34), "--max-bytes ", o.max_bytes,
                  " is over 16 GiB; benchmark smaller messages");
  PTRAIN_CHECK_AS(ConfigError, o.iters >= 1, "--iters must be at least 1, got ", o.iters);
  PTRAIN_CHECK_AS(ConfigError, o.warmup >= 0, "--warmup must not be negative, got ", o.warmup);
  parseDtype(o.dtype);
}

std::vector<CommBenchResult> runCommBench(ProcessGroup& group, const CommBenchOptions& options,
                                          const std::function<void(const CommBenchResult&)>& onResult) {
  validateCommBenchOptions(options);
  const at::ScalarType dtype = parseDtype(options.dtype);
  const int64_t elementSize = static_cast<int64_t>(c10::elementSize(dtype));
  const int n = group.size();

  std::vector<std::string> ops;
  for (const auto& op : options.ops.empty() ? commBenchOps() : options.ops) {
    if (std::find(ops.begin(), ops.end(), op) != ops.end()) continue;
    if (op == "sendrecv" && (n < 2 || !group.supports(Capability::kSendRecv))) continue;
    ops.push_back(op);
  }

  std::vector<CommBenchResult> results;
  for (const auto& op : ops) {
    std::vector<int64_t> sizes;
    if (op == "barrier") {
      sizes.push_back(0);
    } else {
      for (int64_t b = options.min_bytes; b <= options.max_bytes; b *= 2) sizes.push_back(b);
    }
    for (int64_t requested : sizes) {
      const int64_t count = op == "barrier" ? 0 : countFor(op, requested, elementSize, n);
      Case c = makeCase(group, op, count, dtype, options.device);
      for (int k = 0; k < options.warmup; ++k) c.run();
      // A collective's wait() orders the device's streams, not the host: the
      // clock reads after the device finished.
      const at::Device device(options.device);
      synchronizeDevice(device);
      group.barrier()->wait();
      const auto start = Clock::now();
      for (int k = 0; k < options.iters; ++k) c.run();
      synchronizeDevice(device);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / options.iters;
      c.fill();
      c.run();
      const auto [slowest, wrong] = agree(group, seconds, c.wrong(), device);

      CommBenchResult row;
      row.op = op;
      row.count = count;
      row.bytes = count * elementSize;
      row.dtype = options.dtype;
      row.time_us = slowest * 1e6;
      row.algbw_gbps = slowest > 0 ? static_cast<double>(row.bytes) / slowest / 1e9 : 0.0;
      row.busbw_gbps = row.algbw_gbps * commBenchBusFactor(op, n);
      row.wrong = wrong;
      if (onResult) onResult(row);
      results.push_back(row);
    }
  }
  return results;
}

}  // namespace ptrain

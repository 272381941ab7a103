// Every collective of every comm plugin, over world sizes 1..4, element
// counts from 0 to about a million, and four dtypes. Each rank contributes
// values that are a closed-form function of (rank, index), so every result is
// checked exactly against a closed form, never against another collective.
//
// All values stay below 2^24, so float32 holds them (and their sums,
// products and averages) exactly.
#include <gtest/gtest.h>

#include "conformance/comm_harness.h"
#include "support/test_support.h"

namespace ptrain::test {
namespace {

struct WorldCase {
  std::string backend;
  int world = 1;
};

// Readable names in gtest and ctest output instead of a byte dump.
void PrintTo(const WorldCase& c, std::ostream* os) { *os << c.backend << " world " << c.world; }

std::vector<WorldCase> worldCases() {
  std::vector<WorldCase> cases;
  for (const auto& plugin : commPluginsUnderTest()) {
    for (int world = 1; world <= plugin.max_world; ++world) cases.push_back({plugin.name, world});
  }
  return cases;
}

std::string worldName(const ::testing::TestParamInfo<WorldCase>& info) {
  return info.param.backend + "_world" + std::to_string(info.param.world);
}

// Every dtype runs inside one set of rank processes: starting processes and
// groups costs more than the operations.
const std::vector<at::ScalarType> kDtypes{at::kFloat, at::kDouble, at::kInt, at::kLong};

// 0 and 1 element, odd sizes that split unevenly over any chunking, and one
// large message (about a million elements in all) that makes Gloo pick its
// bandwidth algorithms.
const std::vector<int64_t> kCounts{0, 1, 7, 1000, (1 << 20) + 3};
// For collectives whose buffer holds one block per rank: the same sizes per
// block, with the large one split over the ranks so the whole stays ~1M.
std::vector<int64_t> blockCounts(int n) { return {0, 1, 7, 1000, (1 << 20) / n + 3}; }

// Reports the first differing element rather than a whole tensor.
void expectSame(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  ASSERT_EQ(actual.numel(), expected.numel()) << what;
  if (at::equal(actual.reshape({-1}), expected.reshape({-1}))) return;
  at::Tensor diff = actual.reshape({-1}).ne(expected.reshape({-1})).nonzero();
  int64_t first = diff[0][0].item<int64_t>();
  ADD_FAILURE() << what << ": " << diff.size(0) << " of " << actual.numel() << " elements differ; first at " << first
                << ": got " << actual.reshape({-1})[first].item<double>() << ", expected "
                << expected.reshape({-1})[first].item<double>();
}

std::string ctx(at::ScalarType dtype, const char* op, int64_t count, int rank, const char* reduce = "") {
  return detail::concat(op, reduce[0] ? "(" : "", reduce, reduce[0] ? ")" : "", " ", dtypeName(dtype), " count=", count,
                        " rank=", rank);
}

const char* opName(ReduceOp op) { return ptrain::toString(op); }

int64_t factorial(int n) { return n <= 1 ? 1 : n * factorial(n - 1); }

// Contributions and their closed-form reductions over ranks 0..n-1, as a
// function of the element index i.
at::Tensor sumInput(const at::Tensor& i, int r) { return (r + 1) * 1000 + i.remainder(997); }
at::Tensor sumExpected(const at::Tensor& i, int n) { return 500 * n * (n + 1) + n * i.remainder(997); }
// The sum is n * (500 (n+1) + i mod 997), so the average is exact in every dtype.
at::Tensor avgExpected(const at::Tensor& i, int n) { return 500 * (n + 1) + i.remainder(997); }
// Even indices grow with the rank, odd ones shrink: max and min come from
// opposite ends, with negative values in play.
at::Tensor extremaInput(const at::Tensor& i, int r) {
  return at::where(i.remainder(2) == 0, at::full_like(i, r), at::full_like(i, -r)) * 10 + i.remainder(5);
}
at::Tensor maxExpected(const at::Tensor& i, int n) {
  return at::where(i.remainder(2) == 0, at::full_like(i, 10 * (n - 1)), at::zeros_like(i)) + i.remainder(5);
}
at::Tensor minExpected(const at::Tensor& i, int n) {
  return at::where(i.remainder(2) == 0, at::zeros_like(i), at::full_like(i, -10 * (n - 1))) + i.remainder(5);
}
// i mod 3 == 0: r + 1 (product n!); == 1: -1 (product (-1)^n); == 2: 2 (product 2^n).
at::Tensor productInput(const at::Tensor& i, int r) {
  auto m = i.remainder(3);
  return at::where(m == 0, at::full_like(i, r + 1), at::where(m == 1, at::full_like(i, -1), at::full_like(i, 2)));
}
at::Tensor productExpected(const at::Tensor& i, int n) {
  auto m = i.remainder(3);
  return at::where(m == 0, at::full_like(i, factorial(n)),
                   at::where(m == 1, at::full_like(i, n % 2 == 0 ? 1 : -1), at::full_like(i, int64_t{1} << n)));
}

struct ReduceCase {
  ReduceOp op;
  at::Tensor (*input)(const at::Tensor&, int);
  at::Tensor (*expected)(const at::Tensor&, int);
};
const std::vector<ReduceCase> kReduceCases{
    {ReduceOp::kSum, sumInput, sumExpected},          {ReduceOp::kAvg, sumInput, avgExpected},
    {ReduceOp::kMax, extremaInput, maxExpected},      {ReduceOp::kMin, extremaInput, minExpected},
    {ReduceOp::kProduct, productInput, productExpected},
};

class CommCollectives : public ::testing::TestWithParam<WorldCase> {};

TEST_P(CommCollectives, AllreduceEveryOpMatchesClosedForm) {
  const auto c = GetParam();
  runCommRanks(c.backend, c.world, [&](CommRank& comm) {
    auto& g = comm.world();
    const int n = g.size(), r = g.rank();
    for (at::ScalarType dtype : kDtypes) {
      for (int64_t count : kCounts) {
        at::Tensor i = at::arange(count, at::kLong);
        for (const auto& rc : kReduceCases) {
          at::Tensor t = rc.input(i, r).to(dtype);
          AllreduceOptions opts;
          opts.op = rc.op;
          g.allreduce(t, opts)->wait();
          expectSame(t, rc.expected(i, n).to(dtype), ctx(dtype, "allreduce", count, r, opName(rc.op)));
        }
      }
      // A multi-dimensional tensor is reduced element by element the same way.
      at::Tensor i2 = at::arange(6 * 5, at::kLong).view({6, 5});
      at::Tensor t2 = sumInput(i2, r).to(dtype);
      g.allreduce(t2)->wait();
      expectSame(t2, sumExpected(i2, n).to(dtype), ctx(dtype, "allreduce 2-D", 30, r));
    }
  });
}

TEST_P(CommCollectives, AllgatherPlacesEachRankInItsBlock) {
  const auto c = GetParam();
  runCommRanks(c.backend, c.world, [&](CommRank& comm) {
    auto& g = comm.world();
    const int n = g.size(), r = g.rank();
    for (at::ScalarType dtype : kDtypes) {
      for (int64_t count : blockCounts(n)) {
        // Rank r's element i is r * count + i, so the gathered whole is 0, 1, 2, ...
        at::Tensor input = (r * count + at::arange(count, at::kLong)).to(dtype);
        at::Tensor output = at::full({n * count}, -1, at::TensorOptions().dtype(dtype));
        g.allgather(output, input)->wait();
        expectSame(output, at::arange(n * count, at::kLong).to(dtype), ctx(dtype, "allgather", count, r));
      }
      // Dim-0 blocks of a 2-D output: [3, 5] per rank -> [3n, 5].
      at::Tensor input = (r * 15 + at::arange(15, at::kLong)).view({3, 5}).to(dtype);
      at::Tensor output = at::zeros({3 * n, 5}, at::TensorOptions().dtype(dtype));
      g.allgather(output, input)->wait();
      expectSame(output, at::arange(15 * n, at::kLong).view({3 * n, 5}).to(dtype), ctx(dtype, "allgather 2-D", 15, r));
    }
  });
}

// From a megabyte on, the host backend gathers by one broadcast per member
// into the output's blocks: the same result, separate input or in place
// (the input a view of the member's own block, as the distributed
// optimizer's parameter buffer gathers), and in a 16-bit dtype.
TEST_P(CommCollectives, LargeAllgatherPlacesEachRankInItsBlockInPlaceToo) {
  const auto c = GetParam();
  runCommRanks(c.backend, c.world, [&](CommRank& comm) {
    auto& g = comm.world();
    const int n = g.size(), r = g.rank();
    const int64_t count = 300001;  // x 4 bytes x n >= 1 MiB
    at::Tensor expected = at::arange(n * count, at::kLong).to(at::kFloat);  // exact below 2^24
    for (bool inPlace : {false, true}) {
      at::Tensor output = at::full({n * count}, -1.0f);
      at::Tensor own = (r * count + at::arange(count, at::kLong)).to(at::kFloat);
      at::Tensor input = own;
      if (inPlace) {
        input = output.narrow(0, r * count, count);
        input.copy_(own);
      }
      g.allgather(output, input)->wait();
      expectSame(output, expected, ctx(at::kFloat, inPlace ? "large allgather in place" : "large allgather", count, r));
    }
    // bf16: small integers, exact, 2 bytes each.
    const int64_t halfCount = 600001;
    at::Tensor pattern = at::arange(n * halfCount, at::kLong).remainder(97);
    at::Tensor output = at::zeros({n * halfCount}, at::kBFloat16);
    g.allgather(output, pattern.narrow(0, r * halfCount, halfCount).to(at::kBFloat16))->wait();
    expectSame(output, pattern.to(at::kBFloat16), ctx(at::kBFloat16, "large allgather", halfCount, r));
  });
}

TEST_P(CommCollectives, ReduceScatterEveryOpMatchesClosedForm) {
  const auto c = GetParam();
  runCommRanks(c.backend, c.world, [&](CommRank& comm) {
    auto& g = comm.world();
    const int n = g.size(), r = g.rank();
    for (at::ScalarType dtype : kDtypes) {
      for (int64_t count : blockCounts(n)) {
        // Input element f (of n * count) follows the allreduce contributions;
        // rank r receives the reduction of block r: indices r*count ... .
        at::Tensor f = at::arange(n * count, at::kLong);
        at::Tensor mine = f.narrow(0, r * count, count);
        for (const auto& rc : kReduceCases) {
          at::Tensor input = rc.input(f, r).to(dtype);
          at::Tensor output = at::full({count}, -1, at::TensorOptions().dtype(dtype));
          ReduceScatterOptions opts;
          opts.op = rc.op;
          g.reduceScatter(output, input, opts)->wait();
          expectSame(output, rc.expected(mine, n).to(dtype), ctx(dtype, "reduce_scatter", count, r, opName(rc.op)));
        }
      }
    }
  });
}

// bf16 and fp16, which the models' activations and tensor-parallel sums use:
// collectives that move values move them bit for bit (a backend without the
// dtype, Gloo for bf16, carries them as a dtype of the same width), and sums
// are taken in float32 and rounded once, so they are the float32 sum of the
// values rounded to the dtype: (1 + 2^-7) * n here, which a sum in bf16 step
// by step would round at every step.
TEST_P(CommCollectives, HalfPrecisionMovesBitForBitAndSumsInFloat32) {
  const auto c = GetParam();
  runCommRanks(c.backend, c.world, [&](CommRank& comm) {
    auto& g = comm.world();
    const int n = g.size(), r = g.rank();
    for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
      const auto opts = at::TensorOptions().dtype(dtype);
      at::Tensor t = at::full({5}, 1.0 + 1.0 / 128, opts);
      g.allreduce(t)->wait();
      expectSame(t, at::full({5}, n * (1.0 + 1.0 / 128), at::kFloat).to(dtype), ctx(dtype, "allreduce", 5, r, "sum"));
      // Values up to 4 * 30 are integers every dtype here holds exactly.
      at::Tensor input = (r * 30 + at::arange(30, at::kLong)).to(dtype);
      at::Tensor output = at::full({n * 30}, -1, opts);
      g.allgather(output, input)->wait();
      expectSame(output, at::arange(n * 30, at::kLong).to(dtype), ctx(dtype, "allgather", 30, r));
      at::Tensor blocks = at::full({n * 3}, 1.0 + 1.0 / 128, opts);
      at::Tensor mine = at::zeros({3}, opts);
      g.reduceScatter(mine, blocks)->wait();
      expectSame(mine, at::full({3}, n * (1.0 + 1.0 / 128), at::kFloat).to(dtype),
                 ctx(dtype, "reduce_scatter", 3, r, "sum"));
      at::Tensor b = r == 0 ? at::arange(9, at::kLong).to(dtype) : at::zeros({9}, opts);
      BroadcastOptions root;
      g.broadcast(b, root)->wait();
      expectSame(b, at::arange(9, at::kLong).to(dtype), ctx(dtype, "broadcast", 9, r));
      at::Tensor sendRows = (r * 20 + at::arange(2 * n, at::kLong)).to(dtype).view({n, 2});
      at::Tensor recvRows = at::zeros({n, 2}, opts);
      g.allToAll(recvRows, sendRows)->wait();
      for (int j = 0; j < n; ++j) {
        expectSame(recvRows[j], (j * 20 + 2 * r + at::arange(2, at::kLong)).to(dtype), ctx(dtype, "all_to_all", 2, r));
      }
    }
  });
}

TEST_P(CommCollectives, BroadcastFromEveryRoot) {
  const auto c = GetParam();
  runCommRanks(c.backend, c.world, [&](CommRank& comm) {
    auto& g = comm.world();
    const int n = g.size(), r = g.rank();
    for (at::ScalarType dtype : kDtypes) {
      for (int64_t count : kCounts) {
        at::Tensor i = at::arange(count, at::kLong);
        for (int root = 0; root < n; ++root) {
          at::Tensor expected = (root * 100000 + i.remainder(99991)).to(dtype);
          at::Tensor t = r == root ? expected.clone() : at::full({count}, -7, at::TensorOptions().dtype(dtype));
          BroadcastOptions opts;
          opts.root = root;
          g.broadcast(t, opts)->wait();
          expectSame(t, expected, ctx(dtype, "broadcast", count, r, std::to_string(root).c_str()));
        }
      }
    }
  });
}

TEST_P(CommCollectives, AllToAllEqualSplits) {
  const auto c = GetParam();
  runCommRanks(c.backend, c.world, [&](CommRank& comm) {
    auto& g = comm.world();
    const int n = g.size(), r = g.rank();
    for (at::ScalarType dtype : kDtypes) {
      for (int64_t count : blockCounts(n)) {
        // Block j of rank r's input holds (r n + j) * 100000 + i; after the
        // exchange block j of rank r's output must hold (j n + r) * 100000 + i.
        at::Tensor f = at::arange(n * count, at::kLong);
        at::Tensor block = count > 0 ? f.div(count, "floor") : f;
        at::Tensor i = count > 0 ? f.remainder(count).remainder(100000) : f;
        at::Tensor input = ((r * n + block) * 100000 + i).to(dtype);
        at::Tensor expected = ((block * n + r) * 100000 + i).to(dtype);
        at::Tensor output = at::full({n * count}, -1, at::TensorOptions().dtype(dtype));
        g.allToAll(output, input)->wait();
        expectSame(output, expected, ctx(dtype, "all_to_all", count, r));
      }
    }
  });
}

TEST_P(CommCollectives, AllToAllUnevenSplits) {
  const auto c = GetParam();
  runCommRanks(c.backend, c.world, [&](CommRank& comm) {
    auto& g = comm.world();
    if (!g.supports(Capability::kAllToAllUneven)) {
      GTEST_SKIP() << c.backend << " does not support uneven all_to_all";
    }
    const int n = g.size(), r = g.rank();
    for (at::ScalarType dtype : kDtypes) {
      const int64_t width = 3;
      for (int64_t scale : {1, 700}) {
        // Rows sent from src to dst: uneven, including zero-row pairs.
        auto rows = [&](int src, int dst) -> int64_t { return ((src + 2 * dst) % 3) * scale + (src == dst ? 1 : 0); };
        // Element (row, col) of the src -> dst block.
        auto block = [&](int src, int dst) {
          at::Tensor e = at::arange(rows(src, dst) * width, at::kLong).view({rows(src, dst), width});
          return ((src * n + dst) * 8192 + e).to(dtype);
        };
        AllToAllOptions opts;
        std::vector<at::Tensor> inBlocks, expectedBlocks;
        for (int j = 0; j < n; ++j) {
          opts.input_split_sizes.push_back(rows(r, j));
          opts.output_split_sizes.push_back(rows(j, r));
          inBlocks.push_back(block(r, j));
          expectedBlocks.push_back(block(j, r));
        }
        at::Tensor input = at::cat(inBlocks, 0);
        at::Tensor expected = at::cat(expectedBlocks, 0);
        at::Tensor output = at::full_like(expected, -1);
        g.allToAll(output, input, opts)->wait();
        expectSame(output, expected, ctx(dtype, "all_to_all uneven", input.size(0), r));
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Comm, CommCollectives, ::testing::ValuesIn(worldCases()), worldName);

// ------------------------------------------------------------------------
// Point to point and barrier: dtype does not matter, world size does.

class CommWorld : public ::testing::TestWithParam<WorldCase> {};

TEST_P(CommWorld, SendRecvRingWithTags) {
  const auto c = GetParam();
  if (c.world < 2) GTEST_SKIP() << "point to point needs two ranks";
  runCommRanks(c.backend, c.world, [&](CommRank& comm) {
    auto& g = comm.world();
    if (!g.supports(Capability::kSendRecv)) GTEST_SKIP() << c.backend << " has no send/recv";
    const int n = g.size(), r = g.rank();
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1001}, int64_t{1} << 18}) {
      // Two messages per hop with different tags, received in the opposite
      // order to their sends: tags, not order, must pair them up.
      at::Tensor a = (r * 1000 + at::arange(count, at::kLong)).to(at::kFloat);
      at::Tensor b = (r * 1000 + 7 + at::arange(count, at::kLong));
      PointToPointOptions tagA, tagB;
      tagA.tag = 1;
      tagB.tag = 2;
      auto sendA = g.send(a, next, tagA);
      auto sendB = g.send(b, next, tagB);
      at::Tensor gotB = at::full({count}, -1, at::kLong);
      at::Tensor gotA = at::full({count}, -1, at::kFloat);
      auto recvB = g.recv(gotB, prev, tagB);
      auto recvA = g.recv(gotA, prev, tagA);
      recvB->wait();
      recvA->wait();
      sendA->wait();
      sendB->wait();
      expectSame(gotA, (prev * 1000 + at::arange(count, at::kLong)).to(at::kFloat),
                 ctx(at::kFloat, "recv tag 1", count, r));
      expectSame(gotB, prev * 1000 + 7 + at::arange(count, at::kLong), ctx(at::kLong, "recv tag 2", count, r));
    }
  });
}

TEST_P(CommWorld, BarrierWaitsForTheLastRank) {
  const auto c = GetParam();
  runCommRanks(c.backend, c.world, [&](CommRank& comm) {
    auto& g = comm.world();
    // The last rank arrives 300 ms late; nobody may leave the barrier before.
    const auto start = std::chrono::steady_clock::now();
    g.barrier()->wait();  // line everyone up first
    const auto lined = std::chrono::steady_clock::now();
    if (g.rank() == g.size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    g.barrier()->wait();
    const auto waited = std::chrono::steady_clock::now() - lined;
    if (g.size() > 1) {
      EXPECT_GE(waited, std::chrono::milliseconds(250)) << "rank " << g.rank();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  });
}

TEST_P(CommWorld, OutstandingOperationsCompleteInIssueOrder) {
  const auto c = GetParam();
  runCommRanks(c.backend, c.world, [&](CommRank& comm) {
    auto& g = comm.world();
    const int n = g.size(), r = g.rank();
    // Eight allreduces in flight at once, waited on in reverse.
    std::vector<at::Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 8; ++k) {
      tensors.push_back(at::full({1000 + k}, r + k, at::kLong));
      works.push_back(g.allreduce(tensors.back()));
    }
    for (int k = 7; k >= 0; --k) {
      works[static_cast<size_t>(k)]->wait();
      EXPECT_TRUE(works[static_cast<size_t>(k)]->isCompleted());
      // sum over r of (r + k) = n (n - 1) / 2 + n k
      expectSame(tensors[static_cast<size_t>(k)], at::full({1000 + k}, n * (n - 1) / 2 + n * k, at::kLong),
                 ctx(at::kLong, "allreduce in flight", 1000 + k, r));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Comm, CommWorld, ::testing::ValuesIn(worldCases()), worldName);

}  // namespace
}  // namespace ptrain::test

// The gradient buffer (engine/gradient_buffer.h) on real process groups
// (Gloo over 127.0.0.1): every rank's gradients are small integers chosen by
// rank, micro-batch and parameter, so the sums are exact and each rank
// computes them itself, independently of the buffer. Checked: the all-reduce
// leaves every sum in the parameters' gradients, which are views of the
// buffer; the reduce-scatter leaves each rank its range of the sums, padded
// for ranks that do not divide a bucket; buckets are launched during backward
// (the overlap), except a partial bucket under the reduce-scatter, whose
// completion after backward must be in its sums; a second step accumulates
// into the views afresh after zeroGradients().
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "llm_runtime_fixture.h"
#include "ptrain/engine/gradient_buffer.h"
#include "ptrain/engine/placement.h"
#include "support/test_support.h"

namespace ptrain {
namespace {

using namespace llm_fixture;

struct Param {
  std::string name;
  std::vector<int64_t> sizes;
};

const std::vector<Param> kParams = {{"a", {5}}, {"b", {3, 4}}, {"c", {7}}, {"d", {2, 3}}, {"e", {4}}};

// Rank r's gradient of parameter i in micro-batch m of step s: exact small
// integers, different for every element.
at::Tensor coefficient(int rank, int step, int micro, size_t i, const std::vector<int64_t>& sizes) {
  const double base = 1 + rank * 3 + micro * 5 + static_cast<double>(i) * 7 + step * 11;
  return torch::arange(base, base + c10::multiply_integers(sizes), torch::kFloat).view(sizes);
}

struct Fixture {
  std::vector<std::pair<std::string, at::Tensor>> named;
  Placement placement;
};

Fixture makeParams(const std::string& partial) {
  Fixture f;
  for (const auto& p : kParams) {
    f.named.emplace_back(p.name, torch::zeros(p.sizes).requires_grad_(true));
    if (p.name == partial) f.placement.edit(p.name).partial_gradient = true;
  }
  return f;
}

// Two micro-batches of backward on this rank, as the runtime drives them.
void backward(GradientBuffer& buffer, Fixture& f, int rank, int step) {
  for (int micro = 0; micro < 2; ++micro) {
    buffer.beforeBackward(micro, 2);
    at::Tensor loss = torch::zeros({});
    for (size_t i = 0; i < f.named.size(); ++i) {
      loss = loss + (f.named[i].second * coefficient(rank, step, micro, i, kParams[i].sizes)).sum();
    }
    loss.backward();
  }
}

// The sum over ranks of both micro-batches' gradients of parameter i.
at::Tensor expectedSum(int size, int step, size_t i) {
  at::Tensor sum = torch::zeros(kParams[i].sizes);
  for (int r = 0; r < size; ++r)
    for (int m = 0; m < 2; ++m) sum += coefficient(r, step, m, i, kParams[i].sizes);
  return sum;
}

size_t indexOf(const std::string& name) {
  for (size_t i = 0; i < kParams.size(); ++i)
    if (kParams[i].name == name) return i;
  return 0;
}

void checkAllReduce(int rank, int size, int port, bool overlap) {
  auto comm = worldOf(rank, size, port, layoutOf(size, 1, 1));
  auto groups = comm->groupsFor(comm->layout());
  Fixture f = makeParams("c");
  GradientBuffer::Options options;
  options.bucket_bytes = 12 * 4;  // a few parameters a bucket
  options.overlap = overlap;
  GradientBuffer buffer(f.named, f.placement, *groups, options);
  ASSERT_EQ(buffer.sets().size(), 1u);
  EXPECT_GE(buffer.sets()[0].buckets.size(), 3u);
  for (int step = 0; step < 2; ++step) {
    backward(buffer, f, rank, step);
    buffer.finish();
    for (size_t i = 0; i < f.named.size(); ++i) {
      const at::Tensor& grad = f.named[i].second.grad();
      EXPECT_TRUE(torch::equal(grad, expectedSum(size, step, i))) << f.named[i].first << " step " << step;
    }
    // The gradients are the buffer: each lies inside its bucket's data.
    for (const auto& b : buffer.sets()[0].buckets) {
      for (const auto& m : b.members) {
        EXPECT_EQ(m.param.grad().data_ptr(), b.data.narrow(0, m.offset, m.param.numel()).data_ptr()) << m.name;
      }
    }
    EXPECT_GT(buffer.commBytes(), 0);
    EXPECT_EQ(buffer.overlappedBytes(), overlap ? buffer.commBytes() : 0);
    buffer.zeroGradients();
    for (const auto& [name, p] : f.named) EXPECT_EQ(p.grad().abs().sum().item<float>(), 0.0f) << name;
  }
}

void checkReduceScatter(int rank, int size, int port, bool overlap) {
  auto comm = worldOf(rank, size, port, layoutOf(size, 1, 1));
  auto groups = comm->groupsFor(comm->layout());
  Fixture f = makeParams("c");
  GradientBuffer::Options options;
  options.reduction = GradientBuffer::Reduction::kReduceScatter;
  options.bucket_bytes = 12 * 4;
  options.overlap = overlap;
  GradientBuffer buffer(f.named, f.placement, *groups, options);
  const auto& buckets = buffer.sets().at(0).buckets;
  int64_t partialBytes = 0;
  for (const auto& b : buckets) {
    EXPECT_EQ(b.padded % size, 0);
    if (b.partial) partialBytes += b.padded * 4;
  }
  ASSERT_GT(partialBytes, 0);
  const size_t c = indexOf("c");
  for (int step = 0; step < 2; ++step) {
    backward(buffer, f, rank, step);
    // What a plugin's finishGradients adds after backward (a tied
    // embedding's other half): the reduce-scatter must include it.
    {
      torch::NoGradGuard noGrad;
      f.named[c].second.mutable_grad().add_(100.0 * (rank + 1));
    }
    buffer.finish();
    for (const auto& b : buckets) {
      at::Tensor flat = torch::zeros({b.padded});
      for (const auto& m : b.members) {
        const size_t i = indexOf(m.name);
        at::Tensor sum = expectedSum(size, step, i);
        if (i == c) sum += 100.0 * size * (size + 1) / 2;
        flat.narrow(0, m.offset, m.param.numel()).copy_(sum.reshape({-1}));
      }
      const at::Tensor mine = flat.narrow(0, rank * b.shard, b.shard);
      EXPECT_TRUE(torch::equal(buffer.reducedRange(b), mine)) << "step " << step << ", bucket of " << b.members[0].name;
    }
    EXPECT_EQ(buffer.overlappedBytes(), overlap ? buffer.commBytes() - partialBytes : 0);
    buffer.zeroGradients();
  }
}

TEST(GradientBufferRanks, AllReduceSumsIntoTheGradientsDuringBackward) {
  for (int size : {2, 3}) {
    for (bool overlap : {true, false}) {
      std::string failures = test::runRanks(size, [overlap](int rank, int n, int port) {
        checkAllReduce(rank, n, port, overlap);
      });
      EXPECT_EQ(failures, "") << "world " << size << " overlap " << overlap;
    }
  }
}

TEST(GradientBufferRanks, ReduceScatterLeavesEachRankItsRangeAndWaitsForPartialGradients) {
  for (int size : {2, 3}) {
    for (bool overlap : {true, false}) {
      std::string failures = test::runRanks(size, [overlap](int rank, int n, int port) {
        checkReduceScatter(rank, n, port, overlap);
      });
      EXPECT_EQ(failures, "") << "world " << size << " overlap " << overlap;
    }
  }
}

// One member: nothing to reduce; the all-reduce leaves the parameters out,
// the reduce-scatter (the distributed optimizer's) keeps them whole.
TEST(GradientBuffer, SingleMemberGroups) {
  auto comm = Communicator::loopback();
  auto groups = comm->groupsFor(comm->layout());
  Fixture f = makeParams("");
  GradientBuffer all(f.named, f.placement, *groups, GradientBuffer::Options{});
  EXPECT_TRUE(all.empty());
  GradientBuffer::Options options;
  options.reduction = GradientBuffer::Reduction::kReduceScatter;
  options.skip_single_member_groups = false;
  GradientBuffer scatter(f.named, f.placement, *groups, options);
  backward(scatter, f, 0, 0);
  scatter.finish();
  EXPECT_EQ(scatter.commBytes(), 0);
  for (const auto& b : scatter.sets().at(0).buckets) {
    for (const auto& m : b.members) {
      EXPECT_TRUE(torch::equal(scatter.reducedRange(b).narrow(0, m.offset, m.param.numel()).view(m.param.sizes()),
                               expectedSum(1, 0, indexOf(m.name))))
          << m.name;
    }
  }
}

}  // namespace
}  // namespace ptrain

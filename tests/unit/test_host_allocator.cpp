// The caching host allocator: size classes worked out by hand, reuse of freed
// blocks, alignment, and tensors that behave as with libtorch's allocator.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdint>

#include "ptrain/core/host_allocator.h"

using ptrain::hostAllocationClass;
using ptrain::hostAllocatorStats;

TEST(HostAllocator, SizeClassesAreEightPerPowerOfTwo) {
  EXPECT_EQ(hostAllocationClass(1000), 1000u);                // below 64 KiB: as asked
  EXPECT_EQ(hostAllocationClass(65535), 65535u);
  EXPECT_EQ(hostAllocationClass(65536), 65536u);              // a class boundary
  EXPECT_EQ(hostAllocationClass(65537), 65536u + 8192u);      // next eighth of 64 KiB
  EXPECT_EQ(hostAllocationClass(100000), 13u * 8192u);        // 106496
  EXPECT_EQ(hostAllocationClass(size_t{3} << 20), size_t{3} << 20);
  EXPECT_EQ(hostAllocationClass((size_t{4} << 20) + 1), (size_t{4} << 20) + (size_t{512} << 10));
  // Never more than 12.5% above the request.
  for (size_t bytes = 65536; bytes < (size_t{64} << 20); bytes = bytes * 5 / 4 + 12345) {
    const size_t c = hostAllocationClass(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_LE(static_cast<double>(c), 1.125 * static_cast<double>(bytes));
  }
}

TEST(HostAllocator, FreedBlocksAreReusedAndAligned) {
  ptrain::installCachingHostAllocator();
  ptrain::installCachingHostAllocator();  // idempotent
  const auto before = hostAllocatorStats();
  void* first = nullptr;
  {
    at::Tensor t = torch::empty({1 << 18});  // 1 MiB
    first = t.data_ptr();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    t.fill_(3.0f);
    EXPECT_EQ(t.sum().item<float>(), 3.0f * (1 << 18));
  }
  EXPECT_EQ(hostAllocatorStats().bytes_cached - before.bytes_cached, int64_t{1} << 20);
  {
    // A slightly smaller request falls in the same class and gets the same block.
    at::Tensor again = torch::empty({(1 << 18) - 100});
    EXPECT_EQ(again.data_ptr(), first);
  }
  const auto after = hostAllocatorStats();
  EXPECT_EQ(after.cache_hits - before.cache_hits, 1);
  EXPECT_EQ(after.allocations - before.allocations, 2);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_GE(after.peak_bytes, int64_t{1} << 20);

  // Small tensors go through malloc, still aligned and usable.
  at::Tensor small = torch::arange(10, torch::kFloat32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data_ptr()) % 64, 0u);
  EXPECT_EQ(small.sum().item<float>(), 45.0f);

  ptrain::releaseCachedHostMemory();
  EXPECT_EQ(hostAllocatorStats().bytes_cached, 0);
}

TEST(HostAllocator, TrainingStepsGiveTheSameNumbersAsWithoutIt) {
  // A few SGD steps of a small MLP, first with libtorch's allocator, then with
  // the caching one installed: the same bits.
  auto run = [] {
    torch::manual_seed(5);
    torch::nn::Sequential net(torch::nn::Linear(64, 512), torch::nn::GELU(), torch::nn::Linear(512, 8));
    torch::optim::SGD sgd(net->parameters(), 0.1);
    std::vector<float> losses;
    for (int i = 0; i < 4; ++i) {
      at::Tensor x = torch::randn({128, 64});
      at::Tensor loss = net->forward(x).pow(2).mean();
      sgd.zero_grad();
      loss.backward();
      sgd.step();
      losses.push_back(loss.item<float>());
    }
    return losses;
  };
  const auto plain = run();
  ptrain::installCachingHostAllocator();
  const auto cached = run();
  EXPECT_EQ(plain, cached);
  EXPECT_GT(hostAllocatorStats().cache_hits, 0);
}

#include "ptrain/core/host_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include "ptrain/core/torch_compat.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

namespace ptrain {
namespace {

// Below this, malloc's own bins serve requests from memory it keeps anyway.
constexpr size_t kMinCachedBytes = size_t{64} << 10;
// Every block starts with this header (which keeps the 64-byte alignment
// libtorch's vectorised kernels expect): its size class, so free() finds its list.
constexpr size_t kHeaderBytes = 64;

struct BlockHeader {
  size_t size_class;  // 0: not cached (below the threshold)
  size_t bytes;       // as requested
};

class HostCache {
 public:
  void* allocate(size_t bytes) {
    live_ += static_cast<int64_t>(bytes);
    const size_t sizeClass = hostAllocationClass(bytes);
    if (sizeClass < kMinCachedBytes) return place(c10::alloc_cpu(bytes + kHeaderBytes), 0, bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.allocations;
      stats_.bytes_in_use += static_cast<int64_t>(sizeClass);
      auto it = free_.find(sizeClass);
      if (it != free_.end() && !it->second.empty()) {
        void* base = it->second.back();
        it->second.pop_back();
        ++stats_.cache_hits;
        stats_.bytes_cached -= static_cast<int64_t>(sizeClass);
        return place(base, sizeClass, bytes);
      }
      stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.bytes_in_use + stats_.bytes_cached);
    }
    return place(c10::alloc_cpu(sizeClass + kHeaderBytes), sizeClass, bytes);
  }

  void release(void* data) {
    if (data == nullptr) return;
    void* base = static_cast<char*>(data) - kHeaderBytes;
    const size_t sizeClass = static_cast<BlockHeader*>(base)->size_class;
    live_ -= static_cast<int64_t>(static_cast<BlockHeader*>(base)->bytes);
    if (sizeClass == 0) {
      c10::free_cpu(base);
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytes_in_use -= static_cast<int64_t>(sizeClass);
    stats_.bytes_cached += static_cast<int64_t>(sizeClass);
    free_[sizeClass].push_back(base);
  }

  void releaseAll() {
    std::map<size_t, std::vector<void*>> blocks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks.swap(free_);
      stats_.bytes_cached = 0;
    }
    for (auto& [sizeClass, list] : blocks) {
      for (void* base : list) c10::free_cpu(base);
    }
#ifdef __GLIBC__
    // glibc serves blocks under its mmap threshold (raised up to 32 MiB as
    // large blocks come and go) from its heap and keeps what is freed there:
    // hand the free pages back to the system too.
    ::malloc_trim(0);
#endif
  }

  HostAllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    HostAllocatorStats out = stats_;
    out.live_bytes = live_.load();
    return out;
  }

 private:
  static void* place(void* base, size_t sizeClass, size_t bytes) {
    static_cast<BlockHeader*>(base)->size_class = sizeClass;
    static_cast<BlockHeader*>(base)->bytes = bytes;
    return static_cast<char*>(base) + kHeaderBytes;
  }

  std::atomic<int64_t> live_{0};  // every live allocation, any size

  std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> idle blocks
  HostAllocatorStats stats_;
};

// Never destroyed: tensors freed while the process exits still find it.
HostCache& cache() {
  static HostCache* instance = new HostCache();
  return *instance;
}

void deleteBlock(void* data) { cache().release(data); }

class CachingHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) PTRAIN_ALLOCATE_CONST override {
    void* data = cache().allocate(bytes);
    return {data, data, &deleteBlock, c10::Device(c10::DeviceType::CPU)};
  }
#if PTRAIN_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &deleteBlock; }
};

}  // namespace

size_t hostAllocationClass(size_t bytes) {
  // Below the threshold, and beyond any real request (where rounding up
  // would overflow), as asked.
  if (bytes < kMinCachedBytes || bytes > (size_t{1} << 60)) return bytes;
  // Eight classes per power of two: round up to a multiple of 1/8 of the
  // largest power of two not above `bytes`.
  size_t top = size_t{1} << (63 - __builtin_clzll(bytes));
  const size_t step = top / 8;
  return (bytes + step - 1) / step * step;
}

static std::atomic<bool> allocatorInstalled{false};

void installCachingHostAllocator() {
  static CachingHostAllocator allocator;
  static std::once_flag once;
  // Priority above libtorch's default registration, so it stays in place.
  std::call_once(once, [] {
    c10::SetCPUAllocator(&allocator, /*priority=*/10);
    allocatorInstalled = true;
  });
}

bool cachingHostAllocatorInstalled() { return allocatorInstalled.load(); }

void releaseCachedHostMemory() { cache().releaseAll(); }

HostAllocatorStats hostAllocatorStats() { return cache().stats(); }

}  // namespace ptrain

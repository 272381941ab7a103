// A caching allocator for tensors in host memory.
//
// libtorch's default CPU allocator hands every tensor to malloc and back to
// free. glibc serves the large ones (activations, their gradients) with fresh
// mmap()s or returns them to the system when the heap top is trimmed, so each
// training step faults the same memory in again, a page at a time, and the
// kernel zeroes every page first. The caching allocator keeps freed blocks of
// 64 KiB and more in free lists by size class (eight classes per power of two,
// so a block is at most 12.5% larger than asked) and hands them out again:
// after the first step, a step whose tensor sizes repeat allocates nothing
// from the system. Freed blocks stay with the process until
// releaseCachedHostMemory() (which also trims glibc's heap) or its end: a phase with new sizes (evaluation,
// a last partial batch) adds its own classes.
//
// Installed per worker process by `cpu.allocator: caching` (the default);
// tensors allocated before keep their own deleter and are freed as before.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ptrain/core/error.h"

namespace ptrain {

struct HostAllocatorStats {
  int64_t allocations = 0;    // requests of cacheable size
  int64_t cache_hits = 0;     // ... served from a free list
  int64_t bytes_in_use = 0;   // handed out and not yet freed (cacheable sizes, rounded up)
  int64_t bytes_cached = 0;   // freed and kept for reuse
  int64_t peak_bytes = 0;     // most of in_use + cached at once
  int64_t live_bytes = 0;     // bytes of every tensor allocated and not yet freed, any size, as requested
};

// Makes the caching allocator libtorch's CPU allocator for this process.
// Idempotent. Thread-safe once installed.
PTRAIN_API void installCachingHostAllocator();

// Returns every cached block to the system (e.g. before a phase with other
// tensor sizes, or when memory runs short).
PTRAIN_API void releaseCachedHostMemory();

PTRAIN_API HostAllocatorStats hostAllocatorStats();
// True once installCachingHostAllocator() made it libtorch's CPU allocator.
PTRAIN_API bool cachingHostAllocatorInstalled();

// The size a request of `bytes` is rounded up to: itself below the caching
// threshold (64 KiB), else the next of eight classes per power of two.
PTRAIN_API size_t hostAllocationClass(size_t bytes);

}  // namespace ptrain

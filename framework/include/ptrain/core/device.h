// The device a worker computes on, from the recipe's `device` key.
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

#include "ptrain/core/error.h"

namespace ptrain {

// CUDA devices this process sees; 0 where libtorch was built without CUDA.
PTRAIN_API int cudaDeviceCount();

// The name and memory (GiB) of CUDA device `index` (e.g. "NVIDIA H200",
// 139.8); empty and 0 where libtorch was built without CUDA.
PTRAIN_API std::string cudaDeviceName(int index);
PTRAIN_API double cudaDeviceMemoryGib(int index);

// The most memory libtorch's caching allocator has held for tensors on
// `device` since the process began, in MB; 0 for the cpu (peakRssMb() is the
// host's) and in builds without CUDA.
PTRAIN_API double peakDeviceMemoryMb(at::Device device);
// What libtorch's caching allocator holds for tensors on `device` now, in MB;
// 0 for the cpu and in builds without CUDA.
PTRAIN_API double deviceMemoryMb(at::Device device);

// Waits until every kernel queued on `device` has finished; nothing on the
// cpu and in builds without CUDA. For timings of asynchronous work.
PTRAIN_API void synchronizeDevice(at::Device device);

// Floating-point operations per second of float32 matrix products of
// `size` x `size` on this host, measured now on the calling thread's
// intra-op threads for about `seconds`: the host's peak for MFU and planning.
PTRAIN_API double measureHostMatmulFlops(int64_t size, double seconds);

// `requested` is the recipe's device: "cpu", "cuda", or "auto" (cuda when a
// GPU is visible). On cuda, the worker with local rank r takes GPU r and
// makes it the calling thread's current device; a worker without a GPU of its
// own is a ConfigError that says how many there are.
PTRAIN_API at::Device selectDevice(const std::string& requested, int localRank);

// The comm plugin `communication.backend: auto` stands for on `device`.
PTRAIN_API std::string defaultCommBackend(at::Device device);

namespace detail {
// The current CUDA stream of `device` as a cudaStream_t, for ptrain's own
// kernels to queue on (the stream libtorch's ops on that device use).
// Only in builds with CUDA.
void* currentCudaStream(at::Device device);
}  // namespace detail

}  // namespace ptrain

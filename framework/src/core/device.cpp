#include "ptrain/core/device.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <ATen/ATen.h>

#include <chrono>

#include "ptrain/core/text.h"

#if PTRAIN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace ptrain {

int cudaDeviceCount() { return static_cast<int>(torch::cuda::device_count()); }

void synchronizeDevice(at::Device device) {
#if PTRAIN_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
  (void)device;
}

double peakDeviceMemoryMb(at::Device device) {
#if PTRAIN_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    // Entry 0: the aggregate over the small and large pools (StatType
    // moved between namespaces across libtorch releases).
    return static_cast<double>(stats.allocated_bytes[0].peak) / (1 << 20);
  }
#endif
  (void)device;
  return 0;
}

double measureHostMatmulFlops(int64_t size, double seconds) {
  at::NoGradGuard noGrad;
  const at::Tensor a = at::randn({size, size}), b = at::randn({size, size});
  at::Tensor c = at::mm(a, b);  // the first product pays for the threads' start
  int64_t reps = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < seconds || reps == 0) {
    c = at::mm(a, b);
    ++reps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return 2.0 * static_cast<double>(size) * static_cast<double>(size) * static_cast<double>(size) *
         static_cast<double>(reps) / elapsed;
}

double deviceMemoryMb(at::Device device) {
#if PTRAIN_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(stats.allocated_bytes[0].current) / (1 << 20);
  }
#endif
  (void)device;
  return 0;
}

std::string cudaDeviceName(int index) {
#if PTRAIN_WITH_CUDA
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, index) == cudaSuccess) return props.name;
#endif
  (void)index;
  return "";
}

double cudaDeviceMemoryGib(int index) {
#if PTRAIN_WITH_CUDA
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, index) == cudaSuccess) {
    return static_cast<double>(props.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  }
#endif
  (void)index;
  return 0;
}

at::Device selectDevice(const std::string& requested, int localRank) {
  PTRAIN_CHECK_AS(ConfigError, requested == "auto" || requested == "cpu" || requested == "cuda", "device: '",
                  requested, "' is not one of auto, cpu, cuda");
  if (requested == "cpu") return at::Device(at::kCPU);
  const int count = cudaDeviceCount();
  if (requested == "auto" && count == 0) return at::Device(at::kCPU);
#if PTRAIN_WITH_CUDA
  PTRAIN_CHECK_AS(ConfigError, count > 0,
                  "device: cuda, but this process sees no CUDA device (check CUDA_VISIBLE_DEVICES and the driver); "
                  "set device: cpu or auto");
#else
  PTRAIN_CHECK_AS(ConfigError, count > 0, "device: cuda, but this build of ptrain has no CUDA (libtorch ",
                  TORCH_VERSION, " is a CPU build); set device: cpu or auto, or build against a libtorch with CUDA ",
                  "(make TORCH=pypi, see docs/gpu.md)");
#endif
  if (requested == "auto" && localRank >= count) {
    throw ConfigError(detail::concat("device: auto found ", count, " GPU(s), too few for local rank ", localRank,
                                     ": start at most ", count, " workers per host, or set device: cpu"));
  }
  PTRAIN_CHECK_AS(ConfigError, localRank < count, "device: cuda: local rank ", localRank,
                  " has no GPU of its own (this host shows ", count, "); start at most ", count,
                  " workers per host (--nproc)");
  at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(localRank));
#if PTRAIN_WITH_CUDA
  c10::cuda::set_device(device.index());
#endif
  return device;
}

std::string defaultCommBackend(at::Device device) { return device.is_cuda() ? "nccl" : "gloo"; }

namespace detail {

void* currentCudaStream(at::Device device) {
#if PTRAIN_WITH_CUDA
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  throw Error(concat("no CUDA in this build: no stream for ", device.str()));
#endif
}

}  // namespace detail
}  // namespace ptrain

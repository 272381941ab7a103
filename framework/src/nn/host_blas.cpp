#include "host_blas.h"

#include <dlfcn.h>

#include <limits>
#include <mutex>

namespace ptrain::nn::detail {
namespace {

using SgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                         const int*, const float*, const int*, const float*, float*, const int*);
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();

template <typename Fn>
Fn lookup(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

SgemmFn sgemm() {
  static const SgemmFn fn = lookup<SgemmFn>("sgemm_");
  return fn;
}

}  // namespace

bool blasAvailable() { return sgemm() != nullptr; }

// A row-major matrix is its transpose in column-major order, so the row-major
// product C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T.
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const char ta = transA ? 'T' : 'N', tb = transB ? 'T' : 'N';
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const int ldai = static_cast<int>(lda), ldbi = static_cast<int>(ldb), ldci = static_cast<int>(ldc);
  sgemm()(&tb, &ta, &ni, &mi, &ki, &alpha, b, &ldbi, a, &ldai, &beta, c, &ldci);
}

bool setBlasSingleThreaded(bool single) {
  static const auto set = lookup<SetThreadsFn>("openblas_set_num_threads");
  static const auto get = lookup<GetThreadsFn>("openblas_get_num_threads");
  static const auto parallelKind = lookup<GetThreadsFn>("openblas_get_parallel");
  if (set == nullptr || get == nullptr) return false;
  // 0: a sequential build; 2: the OpenMP build, which runs on the calling
  // thread inside a parallel region by itself, and whose set_num_threads
  // would also set libtorch's OpenMP thread count. Only the pthreads build (1)
  // needs holding to one thread.
  if (parallelKind != nullptr && parallelKind() != 1) return true;
  static std::mutex mutex;
  static int saved = 0;  // OpenBLAS's own count while ptrain holds it at 1
  std::lock_guard<std::mutex> lock(mutex);
  if (single && saved == 0) {
    saved = get();
    set(1);
  } else if (!single && saved > 0) {
    set(saved);
    saved = 0;
  }
  return true;
}

}  // namespace ptrain::nn::detail

// The BLAS libtorch links (OpenBLAS on Debian), called directly by ptrain's
// host kernels (host_kernels.cpp, attention.cpp). Looked up at run time, so
// nothing else is linked and a libtorch without it simply keeps its own ops.
#pragma once

#include <cstdint>

namespace ptrain::nn::detail {

// True when sgemm_ was found.
bool blasAvailable();

// True when a dimension or leading dimension fits the BLAS's 32-bit integers.
inline bool fitsBlasInt(int64_t v) { return v >= 0 && v <= 2147483647; }

// Row-major C[m x n] = alpha * op(A)[m x k] * op(B)[k x n] + beta * C, where
// op(X) is X or, when trans*, the transpose of the stored matrix.
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Makes OpenBLAS run every product on the calling thread (true) or restores
// its own thread count (false). Returns false when the BLAS has no such
// control (not OpenBLAS), and then changes nothing.
bool setBlasSingleThreaded(bool single);

}  // namespace ptrain::nn::detail

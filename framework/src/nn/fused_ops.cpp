#include "ptrain/nn/fused.h"

#include <torch/torch.h>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "ptrain/core/device.h"
#include "fused_rows_f32.h"
#include "ptrain/nn/host_fallback.h"
#if PTRAIN_WITH_CUDA
#include "fused_kernels_cuda.h"
#endif

namespace ptrain::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Arithmetic type of a storage type: float for float, bf16 and fp16.
template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

at::ScalarType accDtype(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// Rows per partial sum of a parameter gradient (bias, LayerNorm weight): a
// fixed blocking, so the sums are the same for any number of threads.
constexpr int64_t kRowsPerBlock = 64;

// body(begin, end) over row ranges of [0, rows), on the intra-op pool, with
// tasks of about 32K elements.
template <typename F>
void forRows(int64_t rows, int64_t width, const F& body) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, width));
  at::parallel_for(0, rows, grain, body);
}

// Sums `partial` [blocks, width] over blocks in block order into `out` (width).
template <typename A>
void sumBlocks(const std::vector<A>& partial, int64_t blocks, int64_t width, A* out) {
  std::fill(out, out + width, A(0));
  for (int64_t b = 0; b < blocks; ++b) {
    const A* p = partial.data() + b * width;
    for (int64_t j = 0; j < width; ++j) out[j] += p[j];
  }
}

// Calls row(r, part) for every row r of a [rows, width] array, rows split
// over the intra-op threads in fixed blocks; when `columnSum` is given, `part`
// is the block's partial column sums (width values) for row to add into, and
// the blocks' sums are added in block order, so the result is the same for any
// number of threads, and rounded to T. The parameter gradients of
// bias-carrying fusions are such sums. Without `columnSum`, part is null.
template <typename T, typename F>
void rowBlocksWithColumnSum(int64_t rows, int64_t width, T* columnSum, const F& row) {
  using A = Acc<T>;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<A> partial(columnSum != nullptr ? static_cast<size_t>(blocks * width) : 0, A(0));
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      A* part = columnSum != nullptr ? partial.data() + b * width : nullptr;
      for (int64_t r = b * kRowsPerBlock; r < std::min(rows, (b + 1) * kRowsPerBlock); ++r) row(r, part);
    }
  });
  if (columnSum == nullptr) return;
  std::vector<A> total(static_cast<size_t>(width));
  sumBlocks(partial, blocks, width, total.data());
  for (int64_t j = 0; j < width; ++j) columnSum[j] = static_cast<T>(total[j]);
}

// As rowBlocksWithColumnSum, element by element: element(o, j) for o = r *
// width + j returns the value whose column sums go to `columnSum`.
template <typename T, typename F>
void rowsWithColumnSum(int64_t rows, int64_t width, T* columnSum, const F& element) {
  using A = Acc<T>;
  rowBlocksWithColumnSum<T>(rows, width, columnSum, [&](int64_t r, A* part) {
    for (int64_t j = 0; j < width; ++j) {
      const A v = element(r * width + j, j);
      if (part != nullptr) part[j] += v;
    }
  });
}

// libtorch 1.13's custom functions cannot take an undefined tensor as an
// input: an optional input travels as an empty tensor instead.
at::Tensor orAbsent(const at::Tensor& t) { return t.defined() ? t : at::empty({0}); }
at::Tensor given(const at::Tensor& t) { return t.defined() && t.numel() > 0 ? t : at::Tensor(); }

// Where the fused kernels run: host tensors of any floating dtype, and (in
// builds with CUDA) device tensors in float32, fp16 or bf16.
bool fusedKernelApplies(const at::Tensor& t) {
  if (t.is_cpu()) return t.is_floating_point();
#if PTRAIN_WITH_CUDA
  const auto d = t.scalar_type();
  return t.is_cuda() && (d == at::kFloat || d == at::kHalf || d == at::kBFloat16);
#else
  return false;
#endif
}

#if PTRAIN_WITH_CUDA
detail::CudaDtype cudaDtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf: return detail::CudaDtype::kHalf;
    case at::kBFloat16: return detail::CudaDtype::kBFloat16;
    default: return detail::CudaDtype::kFloat;
  }
}
void* streamOf(const at::Tensor& t) { return ::ptrain::detail::currentCudaStream(t.device()); }
// A device pointer, or null for an undefined tensor.
const void* ptr(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
#endif

// ----------------------------------------------------------- masked softmax

template <typename T>
void maskedSoftmaxRows(const T* x, const Acc<T>* mask, T* y, int64_t rows, int64_t queries, int64_t width,
                       Acc<T> scale) {
  using A = Acc<T>;
  forRows(rows, width, [&](int64_t begin, int64_t end) {
    std::vector<A> buf(static_cast<size_t>(width));
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * width;
      T* yr = y + r * width;
      const A* m = mask != nullptr ? mask + (r % queries) * width : nullptr;
      A largest = -std::numeric_limits<A>::infinity();
      for (int64_t j = 0; j < width; ++j) {
        const A v = scale * static_cast<A>(xr[j]) + (m != nullptr ? m[j] : A(0));
        buf[j] = v;
        largest = std::max(largest, v);
      }
      if (largest == -std::numeric_limits<A>::infinity()) {  // every entry masked
        std::fill(yr, yr + width, T(0));
        continue;
      }
      A sum = 0;
      for (int64_t j = 0; j < width; ++j) {
        const A e = std::exp(buf[j] - largest);
        buf[j] = e;
        sum += e;
      }
      const A inv = A(1) / sum;
      for (int64_t j = 0; j < width; ++j) yr[j] = static_cast<T>(buf[j] * inv);
    }
  });
}

template <typename T>
void maskedSoftmaxBackwardRows(const T* dy, const T* y, T* dx, int64_t rows, int64_t width, Acc<T> scale) {
  using A = Acc<T>;
  forRows(rows, width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = dy + r * width;
      const T* p = y + r * width;
      T* out = dx + r * width;
      A dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < width; ++j) dot += static_cast<A>(g[j]) * static_cast<A>(p[j]);
      for (int64_t j = 0; j < width; ++j) {
        out[j] = static_cast<T>(scale * static_cast<A>(p[j]) * (static_cast<A>(g[j]) - dot));
      }
    }
  });
}

struct MaskedSoftmaxFn : torch::autograd::Function<MaskedSoftmaxFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& scores, double scale, const at::Tensor& maybeMask) {
    const at::Tensor x = scores.contiguous();
    const at::Tensor mask = given(maybeMask);
    at::Tensor y = at::empty_like(x);
    const int64_t width = x.size(-1), queries = x.size(-2), rows = x.numel() / std::max<int64_t>(1, width);
    const at::Tensor m = mask.defined() ? mask.to(x.device(), accDtype(x)).contiguous() : at::Tensor();
#if PTRAIN_WITH_CUDA
    if (x.is_cuda()) {
      detail::maskedSoftmaxCuda(cudaDtype(x), x.data_ptr(), m.defined() ? m.data_ptr<float>() : nullptr, y.data_ptr(),
                                rows, queries, width, static_cast<float>(scale), streamOf(x));
      ctx->save_for_backward({y});
      ctx->saved_data["scale"] = scale;
      return y;
    }
#endif
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fusedMaskedSoftmax", [&] {
      using A = Acc<scalar_t>;
      maskedSoftmaxRows<scalar_t>(x.data_ptr<scalar_t>(), m.defined() ? m.data_ptr<A>() : nullptr,
                                  y.data_ptr<scalar_t>(), rows, queries, width, static_cast<A>(scale));
    });
    ctx->save_for_backward({y});
    ctx->saved_data["scale"] = scale;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {maskedSoftmaxBackward(grads[0], ctx->get_saved_variables()[0], ctx->saved_data["scale"].toDouble()),
            at::Tensor(), at::Tensor()};
  }

  static at::Tensor maskedSoftmaxBackward(const at::Tensor& gradProbs, const at::Tensor& y, double scale) {
    const at::Tensor dy = gradProbs.to(y.scalar_type()).contiguous();
    at::Tensor dx = at::empty_like(y);
    const int64_t width = y.size(-1), rows = y.numel() / std::max<int64_t>(1, width);
#if PTRAIN_WITH_CUDA
    if (y.is_cuda()) {
      detail::maskedSoftmaxBackwardCuda(cudaDtype(y), dy.data_ptr(), y.data_ptr(), dx.data_ptr(), rows, width,
                                        static_cast<float>(scale), streamOf(y));
      return dx;
    }
#endif
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "fusedMaskedSoftmaxBackward", [&] {
      maskedSoftmaxBackwardRows<scalar_t>(dy.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(),
                                          rows, width, static_cast<Acc<scalar_t>>(scale));
    });
    return dx;
  }
};

// ---------------------------------------------------------------- bias GELU

// tanh(z) and 1 - tanh(z)^2 from e = exp(-2|z|): one exp (about three times
// cheaper than std::tanh here), both within float rounding of the exact
// values, and 1 - tanh^2 = 4e / (1 + e)^2 without the cancellation of
// 1 - t * t where tanh is near +-1 (which GELU's gradient needs).
template <typename A>
inline A tanhOf(A z, A* sech2 = nullptr) {
  const A e = std::exp(A(-2) * std::fabs(z));
  const A d = A(1) + e;
  if (sech2 != nullptr) *sech2 = A(4) * e / (d * d);
  return std::copysign((A(1) - e) / d, z);
}

// GELU, tanh form: 0.5 u (1 + tanh(k0 (u + k1 u^3))).
constexpr double kGeluBeta = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluKappa = 0.044715;

// A row of T as float32, for the float32 row loops (fp16 and bf16 rows are
// widened into a buffer, float rows are used as they are).
template <typename T>
const float* asFloat(const T* row, int64_t width, std::vector<float>& buffer) {
  if constexpr (std::is_same_v<T, float>) {
    return row;
  } else {
    buffer.resize(static_cast<size_t>(width));
    for (int64_t j = 0; j < width; ++j) buffer[j] = static_cast<float>(row[j]);
    return buffer.data();
  }
}

// GELU of x + bias, in float32 (Acc<T>) whatever T is, rounded once to T.
// float, fp16 and bf16 use the vectorised float32 rows; double its own loop.
template <typename T>
void biasGeluRows(const T* x, const T* bias, T* y, int64_t rows, int64_t width) {
  using A = Acc<T>;
  if constexpr (std::is_same_v<A, double>) {
    const A beta = static_cast<A>(kGeluBeta), kappa = static_cast<A>(kGeluKappa);
    forRows(rows, width, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin * width; o < end * width; ++o) {
        const A u = x[o] + (bias != nullptr ? bias[o % width] : A(0));
        y[o] = A(0.5) * u * (A(1) + tanhOf(beta * (u + kappa * u * u * u)));
      }
    });
  } else {
    std::vector<float> biasBuffer;
    const float* b = bias != nullptr ? asFloat(bias, width, biasBuffer) : nullptr;
    forRows(rows, width, [&](int64_t begin, int64_t end) {
      std::vector<float> in, out(std::is_same_v<T, float> ? 0 : static_cast<size_t>(width));
      for (int64_t r = begin; r < end; ++r) {
        T* yr = y + r * width;
        float* target = std::is_same_v<T, float> ? reinterpret_cast<float*>(yr) : out.data();
        detail::biasGeluRowF32(asFloat(x + r * width, width, in), b, target, width);
        if constexpr (!std::is_same_v<T, float>) {
          for (int64_t j = 0; j < width; ++j) yr[j] = static_cast<T>(out[j]);
        }
      }
    });
  }
}

// dx = dy * gelu'(x + bias), one exp per element, in float32 (Acc<T>) and
// rounded once to T; the bias gradient is the sum over rows of the unrounded dx.
template <typename T>
void biasGeluBackwardRows(const T* dy, const T* x, const T* bias, T* dx, T* dbias, int64_t rows, int64_t width) {
  using A = Acc<T>;
  if constexpr (std::is_same_v<A, double>) {
    const A beta = static_cast<A>(kGeluBeta), kappa = static_cast<A>(kGeluKappa);
    rowsWithColumnSum<T>(rows, width, dbias, [&](int64_t o, int64_t j) {
      const A u = x[o] + (bias != nullptr ? bias[j] : A(0));
      A sech2;
      const A t = tanhOf(beta * (u + kappa * u * u * u), &sech2);
      dx[o] = dy[o] * (A(0.5) * (A(1) + t) + A(0.5) * u * sech2 * beta * (A(1) + A(3) * kappa * u * u));
      return dx[o];
    });
  } else {
    std::vector<float> biasBuffer;
    const float* b = bias != nullptr ? asFloat(bias, width, biasBuffer) : nullptr;
    // Buffers per thread: rowBlocksWithColumnSum runs rows of one block on one thread.
    rowBlocksWithColumnSum<T>(rows, width, dbias, [&](int64_t r, float* part) {
      thread_local std::vector<float> dyBuffer, xBuffer, dxBuffer;
      const int64_t o = r * width;
      if constexpr (std::is_same_v<T, float>) {
        detail::biasGeluBackwardRowF32(dy + o, x + o, b, dx + o, part, width);
      } else {
        dxBuffer.resize(static_cast<size_t>(width));
        detail::biasGeluBackwardRowF32(asFloat(dy + o, width, dyBuffer), asFloat(x + o, width, xBuffer), b,
                                       dxBuffer.data(), part, width);
        for (int64_t j = 0; j < width; ++j) dx[o + j] = static_cast<T>(dxBuffer[j]);
      }
    });
  }
}

struct BiasGeluFn : torch::autograd::Function<BiasGeluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& maybeBias) {
    const at::Tensor x = input.contiguous();
    const at::Tensor bias = given(maybeBias);
    const at::Tensor b = bias.defined() ? bias.to(x.scalar_type()).contiguous() : at::Tensor();
    at::Tensor y = at::empty_like(x);
    const int64_t width = x.size(-1), rows = x.numel() / std::max<int64_t>(1, width);
#if PTRAIN_WITH_CUDA
    if (x.is_cuda()) {
      detail::biasGeluCuda(cudaDtype(x), x.data_ptr(), ptr(b), y.data_ptr(), rows, width, streamOf(x));
    } else
#endif
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fusedBiasGelu", [&] {
      biasGeluRows<scalar_t>(x.data_ptr<scalar_t>(), b.defined() ? b.data_ptr<scalar_t>() : nullptr,
                             y.data_ptr<scalar_t>(), rows, width);
    });
    ctx->save_for_backward({x, b});
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.defined() ? bias.scalar_type() : x.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& b = saved[1];
    const at::Tensor dy = grads[0].contiguous();
    at::Tensor dx = at::empty_like(x);
    const int64_t width = x.size(-1), rows = x.numel() / std::max<int64_t>(1, width);
    at::Tensor db = b.defined() ? at::empty({width}, x.options()) : at::Tensor();
#if PTRAIN_WITH_CUDA
    if (x.is_cuda()) {
      detail::biasGeluBackwardCuda(cudaDtype(x), dy.data_ptr(), x.data_ptr(), ptr(b), dx.data_ptr(), rows, width,
                                   streamOf(x));
      if (db.defined()) detail::columnSumCuda(cudaDtype(x), dx.data_ptr(), db.data_ptr(), rows, width, streamOf(x));
    } else
#endif
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fusedBiasGeluBackward", [&] {
      biasGeluBackwardRows<scalar_t>(dy.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                     b.defined() ? b.data_ptr<scalar_t>() : nullptr, dx.data_ptr<scalar_t>(),
                                     db.defined() ? db.data_ptr<scalar_t>() : nullptr, rows, width);
    });
    if (db.defined()) db = db.to(static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt()));
    return {dx, db};
  }
};

// ------------------------------------------------------- bias dropout add

template <typename T>
void biasDropoutAddRows(const T* x, const T* bias, const T* residual, const T* noise, T* out, int64_t rows,
                        int64_t width) {
  using A = Acc<T>;
  forRows(rows, width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t o = r * width;
      for (int64_t j = 0; j < width; ++j) {
        A v = static_cast<A>(x[o + j]) + (bias != nullptr ? static_cast<A>(bias[j]) : A(0));
        // As the unfused ops round: the biased value, then its product with the noise, in T.
        if (noise != nullptr) v = static_cast<A>(static_cast<T>(v)) * static_cast<A>(noise[o + j]);
        out[o + j] = static_cast<T>(static_cast<A>(residual[o + j]) + static_cast<A>(static_cast<T>(v)));
      }
    }
  });
}

// dx = dout * noise (dx null: dout itself); the bias gradient is the sum of
// dx over rows.
template <typename T>
void dropoutBackwardRows(const T* dout, const T* noise, T* dx, T* dbias, int64_t rows, int64_t width) {
  using A = Acc<T>;
  rowsWithColumnSum<T>(rows, width, dbias, [&](int64_t o, int64_t) {
    const T d = noise != nullptr ? static_cast<T>(static_cast<A>(dout[o]) * static_cast<A>(noise[o])) : dout[o];
    if (dx != nullptr) dx[o] = d;
    return static_cast<A>(d);
  });
}

struct BiasDropoutAddFn : torch::autograd::Function<BiasDropoutAddFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& maybeBias,
                            const at::Tensor& residual, const at::Tensor& maybeNoise) {
    const at::Tensor x = input.contiguous();
    const at::Tensor bias = given(maybeBias), noise = given(maybeNoise);
    const at::Tensor r = residual.to(x.scalar_type()).contiguous();
    const at::Tensor b = bias.defined() ? bias.to(x.scalar_type()).contiguous() : at::Tensor();
    const at::Tensor n = noise.defined() ? noise.to(x.scalar_type()).contiguous() : at::Tensor();
    at::Tensor out = at::empty_like(x);
    const int64_t width = x.size(-1), rows = x.numel() / std::max<int64_t>(1, width);
#if PTRAIN_WITH_CUDA
    if (x.is_cuda()) {
      detail::biasDropoutAddCuda(cudaDtype(x), x.data_ptr(), ptr(b), r.data_ptr(), ptr(n), out.data_ptr(), rows, width,
                                 streamOf(x));
    } else
#endif
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fusedBiasDropoutAdd", [&] {
      biasDropoutAddRows<scalar_t>(x.data_ptr<scalar_t>(), b.defined() ? b.data_ptr<scalar_t>() : nullptr,
                                   r.data_ptr<scalar_t>(), n.defined() ? n.data_ptr<scalar_t>() : nullptr,
                                   out.data_ptr<scalar_t>(), rows, width);
    });
    ctx->save_for_backward({n});
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.defined() ? bias.scalar_type() : x.scalar_type());
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["residual_dtype"] = static_cast<int64_t>(residual.scalar_type());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor n = ctx->get_saved_variables()[0];
    const at::Tensor dout = grads[0].contiguous();
    const bool hasBias = ctx->saved_data["has_bias"].toBool();
    const int64_t width = dout.size(-1), rows = dout.numel() / std::max<int64_t>(1, width);
    at::Tensor dx = n.defined() ? at::empty_like(dout) : dout;
    at::Tensor db = hasBias ? at::empty({width}, dout.options()) : at::Tensor();
#if PTRAIN_WITH_CUDA
    if (dout.is_cuda()) {
      if (n.defined()) detail::multiplyCuda(cudaDtype(dout), dout.data_ptr(), n.data_ptr(), dx.data_ptr(), dout.numel(),
                                            streamOf(dout));
      if (hasBias) detail::columnSumCuda(cudaDtype(dout), dx.data_ptr(), db.data_ptr(), rows, width, streamOf(dout));
    } else
#endif
    if (n.defined() || hasBias) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dout.scalar_type(), "fusedBiasDropoutAddBackward", [&] {
        dropoutBackwardRows<scalar_t>(dout.data_ptr<scalar_t>(), n.defined() ? n.data_ptr<scalar_t>() : nullptr,
                                      n.defined() ? dx.data_ptr<scalar_t>() : nullptr,
                                      hasBias ? db.data_ptr<scalar_t>() : nullptr, rows, width);
      });
    }
    if (db.defined()) db = db.to(static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt()));
    at::Tensor dr = dout.to(static_cast<at::ScalarType>(ctx->saved_data["residual_dtype"].toInt()));
    return {dx, db, dr, at::Tensor()};
  }
};

// ------------------------------------------------------------ add LayerNorm

template <typename T, typename W>
void addLayerNormRows(const T* x, const T* residual, const W* weight, const W* bias, T* y, T* sum, Acc<T>* mean,
                      Acc<T>* rstd, int64_t rows, int64_t width, Acc<T> eps) {
  using A = Acc<T>;
  forRows(rows, width, [&](int64_t begin, int64_t end) {
    std::vector<A> s(static_cast<size_t>(width));
    for (int64_t r = begin; r < end; ++r) {
      const int64_t o = r * width;
      A total = 0;
      // (omp simd: the row sums may be taken in vector lanes, in a fixed order.)
#pragma omp simd reduction(+ : total)
      for (int64_t j = 0; j < width; ++j) {
        // The sum as the unfused add stores it (rounded to T).
        const T v = residual != nullptr ? static_cast<T>(static_cast<A>(x[o + j]) + static_cast<A>(residual[o + j]))
                                        : x[o + j];
        if (sum != nullptr) sum[o + j] = v;
        s[j] = static_cast<A>(v);
        total += s[j];
      }
      const A mu = total / static_cast<A>(width);
      A var = 0;
#pragma omp simd reduction(+ : var)
      for (int64_t j = 0; j < width; ++j) var += (s[j] - mu) * (s[j] - mu);
      const A inv = A(1) / std::sqrt(var / static_cast<A>(width) + eps);
      mean[r] = mu;
      rstd[r] = inv;
      for (int64_t j = 0; j < width; ++j) {
        const A w = weight != nullptr ? static_cast<A>(weight[j]) : A(1);
        const A b = bias != nullptr ? static_cast<A>(bias[j]) : A(0);
        y[o + j] = static_cast<T>((s[j] - mu) * inv * w + b);
      }
    }
  });
}

template <typename T, typename W>
void addLayerNormBackwardRows(const T* dy, const T* dsum, const T* s, const W* weight, const Acc<T>* mean,
                              const Acc<T>* rstd, T* ds, Acc<T>* dweight, Acc<T>* dbias, int64_t rows,
                              int64_t width) {
  using A = Acc<T>;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<A> partialW(static_cast<size_t>(blocks * width), A(0)), partialB(static_cast<size_t>(blocks * width), A(0));
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<A> g(static_cast<size_t>(width)), xhat(static_cast<size_t>(width));
    for (int64_t b = b0; b < b1; ++b) {
      A* pw = partialW.data() + b * width;
      A* pb = partialB.data() + b * width;
      for (int64_t r = b * kRowsPerBlock; r < std::min(rows, (b + 1) * kRowsPerBlock); ++r) {
        const int64_t o = r * width;
        A meanG = 0, meanGX = 0;
#pragma omp simd reduction(+ : meanG, meanGX)
        for (int64_t j = 0; j < width; ++j) {
          const A d = static_cast<A>(dy[o + j]);
          xhat[j] = (static_cast<A>(s[o + j]) - mean[r]) * rstd[r];
          g[j] = d * (weight != nullptr ? static_cast<A>(weight[j]) : A(1));
          meanG += g[j];
          meanGX += g[j] * xhat[j];
          pw[j] += d * xhat[j];
          pb[j] += d;
        }
        meanG /= static_cast<A>(width);
        meanGX /= static_cast<A>(width);
        for (int64_t j = 0; j < width; ++j) {
          A v = rstd[r] * (g[j] - meanG - xhat[j] * meanGX);
          if (dsum != nullptr) v += static_cast<A>(dsum[o + j]);
          ds[o + j] = static_cast<T>(v);
        }
      }
    }
  });
  sumBlocks(partialW, blocks, width, dweight);
  sumBlocks(partialB, blocks, width, dbias);
}

struct AddLayerNormFn : torch::autograd::Function<AddLayerNormFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& maybeResidual,
                               const at::Tensor& weight, const at::Tensor& bias, double eps) {
    ctx->set_materialize_grads(false);
    const at::Tensor x = input.contiguous();
    const at::Tensor residual = given(maybeResidual);
    const at::Tensor r = residual.defined() ? residual.to(x.scalar_type()).contiguous() : at::Tensor();
    const at::Tensor w = weight.to(x.scalar_type()).contiguous();
    const at::Tensor b = bias.to(x.scalar_type()).contiguous();
    const int64_t width = x.size(-1), rows = x.numel() / std::max<int64_t>(1, width);
    at::Tensor y = at::empty_like(x);
    at::Tensor sum = r.defined() ? at::empty_like(x) : x;
    at::Tensor mean = at::empty({rows}, x.options().dtype(accDtype(x)));
    at::Tensor rstd = at::empty({rows}, x.options().dtype(accDtype(x)));
#if PTRAIN_WITH_CUDA
    if (x.is_cuda()) {
      detail::addLayerNormCuda(cudaDtype(x), x.data_ptr(), ptr(r), w.data_ptr(), b.data_ptr(), y.data_ptr(),
                               r.defined() ? sum.data_ptr() : nullptr, mean.data_ptr<float>(), rstd.data_ptr<float>(),
                               rows, width, static_cast<float>(eps), streamOf(x));
    } else
#endif
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fusedAddLayerNorm", [&] {
      using A = Acc<scalar_t>;
      addLayerNormRows<scalar_t, scalar_t>(x.data_ptr<scalar_t>(), r.defined() ? r.data_ptr<scalar_t>() : nullptr,
                                           w.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                                           r.defined() ? sum.data_ptr<scalar_t>() : nullptr, mean.data_ptr<A>(),
                                           rstd.data_ptr<A>(), rows, width, static_cast<A>(eps));
    });
    ctx->save_for_backward({sum, w, mean, rstd});
    ctx->saved_data["has_residual"] = r.defined();
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    if (r.defined()) return {y, sum};
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& s = saved[0];
    const at::Tensor& w = saved[1];
    const bool hasResidual = ctx->saved_data["has_residual"].toBool();
    const int64_t width = s.size(-1), rows = s.numel() / std::max<int64_t>(1, width);
    const at::Tensor dy = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(s);
    const at::Tensor dsum = hasResidual && grads.size() > 1 && grads[1].defined() ? grads[1].contiguous() : at::Tensor();
    at::Tensor ds = at::empty_like(s);
    at::Tensor dw = at::empty({width}, s.options().dtype(accDtype(s)));
    at::Tensor db = at::empty({width}, s.options().dtype(accDtype(s)));
#if PTRAIN_WITH_CUDA
    if (s.is_cuda()) {
      detail::addLayerNormBackwardCuda(cudaDtype(s), dy.data_ptr(), ptr(dsum), s.data_ptr(), w.data_ptr(),
                                       saved[2].data_ptr<float>(), saved[3].data_ptr<float>(), ds.data_ptr(),
                                       dw.data_ptr<float>(), db.data_ptr<float>(), rows, width, streamOf(s));
    } else
#endif
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, s.scalar_type(), "fusedAddLayerNormBackward", [&] {
      using A = Acc<scalar_t>;
      addLayerNormBackwardRows<scalar_t, scalar_t>(
          dy.data_ptr<scalar_t>(), dsum.defined() ? dsum.data_ptr<scalar_t>() : nullptr, s.data_ptr<scalar_t>(),
          w.data_ptr<scalar_t>(), saved[2].data_ptr<A>(), saved[3].data_ptr<A>(), ds.data_ptr<scalar_t>(),
          dw.data_ptr<A>(), db.data_ptr<A>(), rows, width);
    });
    const auto weightDtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    return {ds, hasResidual ? ds : at::Tensor(), dw.to(weightDtype), db.to(weightDtype), at::Tensor()};
  }
};

// ------------------------------------------- the same functions from libtorch ops

at::Tensor composedMaskedSoftmax(const at::Tensor& scores, double scale, const at::Tensor& mask) {
  at::Tensor z = scores * scale;
  if (mask.defined()) z = z + mask.to(z.scalar_type());
  // Rows with every entry masked: zeros, as the host kernel gives.
  at::Tensor empty = (z == -std::numeric_limits<double>::infinity()).all(-1, /*keepdim=*/true);
  return torch::softmax(z.masked_fill(empty, 0), -1).masked_fill(empty, 0);
}

}  // namespace

at::Tensor fusedMaskedSoftmax(const at::Tensor& scores, double scale, const at::Tensor& additiveMask) {
  PTRAIN_CHECK(scores.dim() >= 2, "fusedMaskedSoftmax: scores of shape ", scores.sizes(), " need [..., T, S]");
  PTRAIN_CHECK(!additiveMask.defined() || (additiveMask.dim() == 2 && additiveMask.size(0) == scores.size(-2) &&
                                           additiveMask.size(1) == scores.size(-1)),
               "fusedMaskedSoftmax: mask of shape ", additiveMask.sizes(), " for scores ", scores.sizes());
  if (!fusedKernelApplies(scores) || scores.numel() == 0 || (additiveMask.defined() && additiveMask.requires_grad())) {
    return composedMaskedSoftmax(scores, scale, additiveMask);
  }
  return MaskedSoftmaxFn::apply(scores, scale, orAbsent(additiveMask));
}

at::Tensor fusedMaskedSoftmaxBackward(const at::Tensor& gradProbs, const at::Tensor& probs, double scale) {
  PTRAIN_CHECK(gradProbs.sizes().equals(probs.sizes()), "fusedMaskedSoftmaxBackward: gradient ", gradProbs.sizes(),
               " for probabilities ", probs.sizes());
  if (!fusedKernelApplies(probs) || probs.numel() == 0) {
    return (probs * (gradProbs - (gradProbs * probs).sum(-1, /*keepdim=*/true))) * scale;
  }
  return MaskedSoftmaxFn::maskedSoftmaxBackward(gradProbs, probs, scale);
}

at::Tensor fusedBiasGelu(const at::Tensor& x, const at::Tensor& bias) {
  PTRAIN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == x.size(-1)), "fusedBiasGelu: bias of shape ",
               bias.sizes(), " for input ", x.sizes());
  if (!fusedKernelApplies(x) || x.numel() == 0) return torch::gelu(bias.defined() ? x + bias : x, "tanh");
  return BiasGeluFn::apply(x, orAbsent(bias));
}

at::Tensor fusedBiasDropoutAdd(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual,
                               const at::Tensor& noise) {
  PTRAIN_CHECK(residual.sizes().equals(x.sizes()), "fusedBiasDropoutAdd: residual ", residual.sizes(),
               " for input ", x.sizes());
  PTRAIN_CHECK(!noise.defined() || noise.sizes().equals(x.sizes()), "fusedBiasDropoutAdd: noise ", noise.sizes(),
               " for input ", x.sizes());
  PTRAIN_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == x.size(-1)), "fusedBiasDropoutAdd: bias ",
               bias.sizes(), " for input ", x.sizes());
  if (!fusedKernelApplies(x) || x.numel() == 0) {
    at::Tensor v = bias.defined() ? x + bias : x;
    return residual + (noise.defined() ? v * noise : v);
  }
  return BiasDropoutAddFn::apply(x, orAbsent(bias), residual, orAbsent(noise));
}

std::pair<at::Tensor, at::Tensor> fusedAddLayerNorm(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight, const at::Tensor& bias, double eps) {
  const int64_t width = x.size(-1);
  PTRAIN_CHECK(weight.dim() == 1 && weight.size(0) == width && bias.dim() == 1 && bias.size(0) == width,
               "fusedAddLayerNorm: weight ", weight.sizes(), " and bias ", bias.sizes(), " for input ", x.sizes());
  PTRAIN_CHECK(!residual.defined() || residual.sizes().equals(x.sizes()), "fusedAddLayerNorm: residual ",
               residual.sizes(), " for input ", x.sizes());
  if (!fusedKernelApplies(x) || x.numel() == 0) {
    at::Tensor sum = residual.defined() ? x + residual : x;
    return {at::layer_norm(sum, {width}, weight, bias, eps), sum};
  }
  auto out = AddLayerNormFn::apply(x, orAbsent(residual), weight, bias, eps);
  return {out[0], residual.defined() ? out[1] : x};
}

at::Tensor dropoutNoise(const at::Tensor& shard, double p, int64_t dim, int numShards, int index) {
  PTRAIN_CHECK(p >= 0 && p < 1, "dropoutNoise: p=", p, " is outside [0, 1)");
  PTRAIN_CHECK(index >= 0 && index < std::max(1, numShards), "dropoutNoise: shard ", index, " of ", numShards);
  // bernoulli_ may lack the dtype on the host (fp16 on libtorch 1.13): draw
  // in float32, from the same stream.
  const bool widen = computeInFloat32(HostOp::kDropout, shard);
  const auto options = shard.options().dtype(widen ? at::kFloat : shard.scalar_type()).requires_grad(false);
  const int64_t d = dim < 0 ? dim + shard.dim() : dim;
  std::vector<int64_t> full = shard.sizes().vec();
  if (numShards > 1) full[static_cast<size_t>(d)] *= numShards;
  // The steps of torch::dropout on CPU (at::native::_dropout_impl):
  // bernoulli(1 - p) over the whole tensor, divided by (1 - p).
  at::Tensor noise = at::empty(full, options);
  noise.bernoulli_(1 - p);
  if (numShards > 1) noise = noise.narrow(d, index * shard.size(d), shard.size(d));
  noise.div_(1 - p);
  return widen ? noise.to(shard.scalar_type()) : noise;
}

}  // namespace ptrain::nn

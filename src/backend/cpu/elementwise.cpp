// Element-wise ops: SwiGLU (Shazeer 2020), SiLU (Elfwing et al. 2018), GELU (tanh
// approximation, Hendrycks & Gimpel 2016, as GPT-2 and torch's gelu(approximate="tanh")),
// residual add, add_columns (a LoRA adapter's output into its columns), dropout with a
// replayable Philox mask, fill, and the sum of squares (in double) used for gradient norms.
#include "backend/cpu/kernels.h"

#include "backend/cpu/vec_math.h"
#include "core/rng.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
}

template <class T>
void gelu_forward(T* out, const T* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = load(inp[i]);
    const float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    out[i] = store<T>(0.5f * x * (1.f + tanh_approx(u)));
  }
}

template <class T>
void gelu_backward(T* dinp, const T* dout, const T* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = load(inp[i]);
    const float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    const float th = tanh_approx(u);
    const float sech2 = sech2_approx(u);
    const float du = kSqrt2OverPi * (1.f + 3.f * 0.044715f * x * x);
    dinp[i] = store<T>(load(dout[i]) * (0.5f * (1.f + th) + 0.5f * x * sech2 * du));
  }
}

template <class T>
void silu_forward(T* out, const T* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = load(inp[i]);
    out[i] = store<T>(x * sigmoid_approx(x));
  }
}

template <class T>
void silu_backward(T* dinp, const T* dout, const T* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = load(inp[i]);
    const float sg = sigmoid_approx(x);
    dinp[i] = store<T>(load(dout[i]) * sg * (1.f + x * (1.f - sg)));
  }
}

template <class T>
void swiglu_forward(T* out, const T* inp, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = inp + n * 2 * H;
    const T* up = gate + H;
    T* o = out + n * H;
#pragma omp simd
    for (int64_t i = 0; i < H; ++i) {
      const float g = load(gate[i]);
      o[i] = store<T>(g * sigmoid_approx(g) * load(up[i]));
    }
  }
}

template <class T>
void swiglu_backward(T* dinp, const T* dout, const T* inp, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* gate = inp + n * 2 * H;
    const T* up = gate + H;
    const T* dy = dout + n * H;
    T* dgate = dinp + n * 2 * H;
    T* dup = dgate + H;
#pragma omp simd
    for (int64_t i = 0; i < H; ++i) {
      const float g = load(gate[i]), u = load(up[i]), d = load(dy[i]);
      const float sg = sigmoid_approx(g);
      // d silu(g)/dg = sg (1 + g (1 - sg))
      dgate[i] = store<T>(d * u * sg * (1.f + g * (1.f - sg)));
      dup[i] = store<T>(d * g * sg);
    }
  }
}

template <class T>
void add(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = store<T>(load(a[i]) + load(b[i]));
}

template <class T>
void add_columns(T* out, int64_t Wo, const T* src, int64_t Ws, int64_t N, float alpha) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* o = out + n * Wo;
    const T* x = src + n * Ws;
#pragma omp simd
    for (int64_t j = 0; j < Ws; ++j) o[j] = store<T>(std::fma(alpha, load(x[j]), load(o[j])));
  }
}

template <class T>
void dropout(T* out, const T* inp, int64_t n, const DropoutSpec& spec) {
  const float scale = 1.f / (1.f - spec.p);
  // Philox blocks of 4 global elements covering [offset, offset + n).
  const int64_t off = static_cast<int64_t>(spec.offset);
  const int64_t first = off / 4, last = (off + n + 3) / 4;
#pragma omp parallel for schedule(static)
  for (int64_t blk = first; blk < last; ++blk) {
    const PhiloxCounter r = philox_block(spec.seed, spec.stream, static_cast<uint64_t>(blk));
    for (int64_t j = 0; j < 4; ++j) {
      const int64_t i = blk * 4 + j - off;
      if (i < 0 || i >= n) continue;
      out[i] = store<T>(u32_to_uniform(r[j]) >= spec.p ? load(inp[i]) * scale : 0.f);
    }
  }
}

template <class T>
void fill(T* out, float value, int64_t n) {
  const T v = store<T>(value);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = v;
}

void stochastic_round_bf16(bf16* dst, const float* src, int64_t n, uint64_t seed, uint64_t stream,
                           const GlobalIndices& at) {
  // Chunks of consecutive elements; within one, the Philox block of the last global
  // index is reused while the next falls in it (4 per block along a contiguous run).
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    PhiloxCounter r{};
    uint64_t block = UINT64_MAX;
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
      const uint32_t u = __builtin_bit_cast(uint32_t, src[i]);
      if ((u & 0x7f800000u) == 0x7f800000u) {  // Inf or NaN: round to nearest
        dst[i] = store<bf16>(src[i]);
        continue;
      }
      const auto g = static_cast<uint64_t>(at.at(i));
      if (g / 4 != block) r = philox_block(seed, stream, block = g / 4);
      // Adding 16 random bits below the kept mantissa carries into it with probability
      // equal to the discarded fraction. A carry into the exponent is the correct
      // next value (and may reach Inf only from the largest finite values).
      dst[i].bits = static_cast<uint16_t>((u + (r[static_cast<size_t>(g % 4)] & 0xffffu)) >> 16);
    }
  }
}

template <class D, class S>
void convert(D* dst, const S* src, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = store<D>(load(src[i]));
}

template <class D, class S>
void copy_columns(D* dst, int64_t Wd, const S* src, int64_t Ws, int64_t N, int64_t ncols) {
  // One parallel region over the rows (not convert()'s per row: a region entered N times
  // costs more than the copy at LoRA's widths).
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    D* o = dst + n * Wd;
    const S* x = src + n * Ws;
#pragma omp simd
    for (int64_t j = 0; j < ncols; ++j) o[j] = store<D>(load(x[j]));
  }
}

template <class T>
double sum_squares(const T* x, int64_t n) {
  // Fixed chunks summed in chunk order: the result does not depend on the thread count
  // or on the order threads finish (an OpenMP reduction clause guarantees neither).
  constexpr int64_t kChunk = 1 << 14;
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(nchunks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = c * kChunk; i < end; ++i) {
      const double v = load(x[i]);
      s += v * v;
    }
    partial[static_cast<size_t>(c)] = s;
  }
  double s = 0.0;
  for (double p : partial) s += p;
  return s;
}

#define INST_T(T)                                                        \
  template void gelu_forward<T>(T*, const T*, int64_t);                   \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t);        \
  template void silu_forward<T>(T*, const T*, int64_t);                   \
  template void silu_backward<T>(T*, const T*, const T*, int64_t);        \
  template void add<T>(T*, const T*, const T*, int64_t);                  \
  template void add_columns<T>(T*, int64_t, const T*, int64_t, int64_t, float); \
  template void swiglu_forward<T>(T*, const T*, int64_t, int64_t);        \
  template void swiglu_backward<T>(T*, const T*, const T*, int64_t, int64_t); \
  template void dropout<T>(T*, const T*, int64_t, const DropoutSpec&);    \
  template void fill<T>(T*, float, int64_t);                              \
  template double sum_squares<T>(const T*, int64_t);                      \
  template void convert<T, float>(T*, const float*, int64_t);             \
  template void convert<T, bf16>(T*, const bf16*, int64_t);               \
  template void convert<T, f16>(T*, const f16*, int64_t);               \
  template void copy_columns<T, float>(T*, int64_t, const float*, int64_t, int64_t, int64_t); \
  template void copy_columns<T, bf16>(T*, int64_t, const bf16*, int64_t, int64_t, int64_t);   \
  template void copy_columns<T, f16>(T*, int64_t, const f16*, int64_t, int64_t, int64_t);
KILN_CPU_FOR_EACH_T(INST_T)

}  // namespace kiln::cpu

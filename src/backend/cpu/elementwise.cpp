// Element-wise ops: GELU (tanh approximation, Hendrycks & Gimpel 2016, as GPT-2 and
// torch's gelu(approximate="tanh")), residual add, dropout with a replayable Philox mask,
// fill, and the sum of squares (in double) used for gradient norms.
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

void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.f + tanh_approx(u));
  }
}

void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    const float th = tanh_approx(u);
    const float sech2 = sech2_approx(u);
    const float du = kSqrt2OverPi * (1.f + 3.f * 0.044715f * x * x);
    dinp[i] = dout[i] * (0.5f * (1.f + th) + 0.5f * x * sech2 * du);
  }
}

void add(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void dropout(float* out, const float* inp, int64_t n, const DropoutSpec& spec) {
  const float scale = 1.f / (1.f - spec.p);
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const PhiloxCounter r = philox_block(spec.seed, spec.stream, static_cast<uint64_t>(blk));
    for (int64_t j = 0; j < 4; ++j) {
      const int64_t i = blk * 4 + j;
      if (i >= n) break;
      out[i] = u32_to_uniform(r[j]) >= spec.p ? inp[i] * scale : 0.f;
    }
  }
}

void fill(float* out, float value, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = value;
}

double sum_squares(const float* x, int64_t n) {
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
    for (int64_t i = c * kChunk; i < end; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[static_cast<size_t>(c)] = s;
  }
  double s = 0.0;
  for (double p : partial) s += p;
  return s;
}

}  // namespace kiln::cpu

// fp8 on the CPU (Backend::fp8_amax, the quantization of fp8_linear_forward/_backward):
// exact emulation. A value x of a tensor quantized at scale S becomes e4m3(x S) / S (or
// e5m2), computed in fp32 and stored in the tensor's own dtype: S is a power of two
// (core/dtype.h fp8_scale), so the result is an fp8 value times 2^-k, exact in fp32 and
// bf16. The existing GEMMs then multiply these values exactly and accumulate in fp32,
// which is what an fp8 tensor-core GEMM with fp32 accumulation computes (docs/fp8.md).
#include "backend/cpu/kernels.h"

#include <omp.h>

#include <cmath>
#include <limits>

namespace kiln::cpu {

template <class T>
float amax(const T* x, int64_t n) {
  float most = 0.f;
  bool nan = false;
#pragma omp parallel for reduction(max : most) reduction(|| : nan) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(load(x[i]));
    nan = nan || std::isnan(a);
    most = std::max(most, a);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : most;
}

template <class T>
void fp8_quantize(T* out, const T* in, int64_t n, float amax, DType format) {
  if (!std::isfinite(amax)) {  // an Inf or NaN in the tensor (or its group): poison all
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = store<T>(std::numeric_limits<float>::quiet_NaN());
    return;
  }
  const float scale = fp8_scale(amax, format), inv = 1.f / scale;  // powers of two: exact
  auto run = [&](DType fmt) {  // the format a constant in each loop, so that it vectorises
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = store<T>(fp8_round(load(in[i]) * scale, fmt) * inv);
  };
  format == DType::E4M3 ? run(DType::E4M3) : run(DType::E5M2);
}

void fp8_amax_history(float* amax, float* history, float* step_amax, int64_t n, int64_t H,
                      int64_t k, int64_t slot, bool most_recent) {
  for (int64_t i = 0; i < n; ++i) {
    float* h = history + i * H * k;
    for (int64_t j = 0; j < k; ++j) {
      h[slot * k + j] = step_amax[i * k + j];
      float m = h[j];  // the max over the window, a NaN kept (std::max may drop it)
      for (int64_t t = 1; t < H; ++t) {
        const float v = h[t * k + j];
        if (!std::isnan(m) && (std::isnan(v) || v > m)) m = v;
      }
      amax[i * k + j] = most_recent ? step_amax[i * k + j] : m;
      step_amax[i * k + j] = 0.f;
    }
  }
}

#define KILN_FP8_INSTANTIATE(T)                              \
  template float amax<T>(const T*, int64_t);                 \
  template void fp8_quantize<T>(T*, const T*, int64_t, float, DType);
KILN_FP8_INSTANTIATE(float)
KILN_FP8_INSTANTIATE(bf16)
KILN_FP8_INSTANTIATE(f16)
#undef KILN_FP8_INSTANTIATE

}  // namespace kiln::cpu

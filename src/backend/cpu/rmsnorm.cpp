// RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization") over the last
// dimension, as Llama's: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps). Backward:
//   dx_j = rstd (w_j g_j - x_j rstd^2 mean_i(w_i g_i x_i)),  dw_j += g_j x_j rstd.
// The weight gradient is summed per thread into a private fp32 row, then reduced in
// thread order (deterministic for a fixed thread count), as layernorm_backward.
#include "backend/cpu/kernels.h"

#include <omp.h>

#include <cmath>
#include <vector>

namespace kiln::cpu {

template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                     float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += load(x[c]) * load(x[c]);
    const float r = 1.f / std::sqrt(ss / static_cast<float>(C) + eps);
    T* o = out + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c)
      o[c] = store<T>(load(x[c]) * r * (weight ? load(weight[c]) : 1.f));
    rstd[n] = r;
  }
}

template <class T, class G>
void rmsnorm_backward(T* dinp, G* dweight, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int64_t N, int64_t C) {
  const int nt = omp_get_max_threads();
  std::vector<float>& partial = partial_sums(static_cast<size_t>(nt) * C);
#pragma omp parallel
  {
    float* dw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * C;
      const T* dy = dout + n * C;
      const float r = rstd[n];
      float wgx = 0.f;
#pragma omp simd reduction(+ : wgx)
      for (int64_t c = 0; c < C; ++c)
        wgx += load(dy[c]) * (weight ? load(weight[c]) : 1.f) * load(x[c]);
      const float k = r * r * wgx / static_cast<float>(C);
      T* dx = dinp + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float g = load(dy[c]), xc = load(x[c]);
        dx[c] = store<T>(load(dx[c]) + r * (g * (weight ? load(weight[c]) : 1.f) - xc * k));
        dw[c] += g * xc * r;
      }
    }
  }
  if (!dweight) return;
  for (int t = 0; t < nt; ++t) {
    const float* dw = partial.data() + static_cast<size_t>(t) * C;
    for (int64_t c = 0; c < C; ++c) dweight[c] = store<G>(load(dweight[c]) + dw[c]);
  }
}

#define INST_T(T) \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int64_t, int64_t, float);
#define INST_TG(T, G)                                                                   \
  template void rmsnorm_backward<T, G>(T*, G*, const T*, const T*, const T*, const float*, \
                                       int64_t, int64_t);
KILN_CPU_FOR_EACH_T(INST_T)
KILN_CPU_FOR_EACH_TG(INST_TG)

}  // namespace kiln::cpu

// LayerNorm (Ba, Kiros, Hinton 2016) over the last dimension (weight and bias optional), with the backward of
// llm.c's layernorm_backward (dnorm, its mean and its projection on the normalised input).
// Parameter gradients are summed per thread into a private fp32 row, then reduced in
// thread order: deterministic for a fixed thread count.
#include "backend/cpu/kernels.h"

#include <omp.h>

#include <cmath>
#include <vector>

namespace kiln::cpu {

std::vector<float>& partial_sums(size_t n) {
  static thread_local std::vector<float> buf;
  buf.assign(n, 0.f);
  return buf;
}

template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                       const T* bias, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += load(x[c]);
    const float m = s / static_cast<float>(C);
    float v = 0.f;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (load(x[c]) - m) * (load(x[c]) - m);
    const float r = 1.f / std::sqrt(v / static_cast<float>(C) + eps);
    T* o = out + n * C;
    if (weight && bias) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c)
        o[c] = store<T>((load(x[c]) - m) * r * load(weight[c]) + load(bias[c]));
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c)
        o[c] = store<T>((load(x[c]) - m) * r * (weight ? load(weight[c]) : 1.f) +
                        (bias ? load(bias[c]) : 0.f));
    }
    mean[n] = m;
    rstd[n] = r;
  }
}

template <class T, class G>
void layernorm_backward(T* dinp, G* dweight, G* dbias, const T* dout, const T* inp,
                        const T* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C) {
  const int nt = omp_get_max_threads();
  std::vector<float>& partial = partial_sums(static_cast<size_t>(nt) * 2 * C);
#pragma omp parallel
  {
    float* dw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
    float* db = dw + C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * C;
      const T* dy = dout + n * C;
      const float m = mean[n], r = rstd[n];
      float dnorm_mean = 0.f, dnorm_norm_mean = 0.f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int64_t c = 0; c < C; ++c) {
        const float norm = (load(x[c]) - m) * r;
        const float dnorm = load(dy[c]) * (weight ? load(weight[c]) : 1.f);
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= static_cast<float>(C);
      dnorm_norm_mean /= static_cast<float>(C);
      T* dx = dinp + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float norm = (load(x[c]) - m) * r;
        const float g = load(dy[c]);
        const float dnorm = g * (weight ? load(weight[c]) : 1.f);
        dx[c] = store<T>(load(dx[c]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r);
        dw[c] += norm * g;
        db[c] += g;
      }
    }
  }
  for (int t = 0; t < nt; ++t) {
    const float* dw = partial.data() + static_cast<size_t>(t) * 2 * C;
    for (int64_t c = 0; c < C; ++c) {
      if (dweight) dweight[c] = store<G>(load(dweight[c]) + dw[c]);
      if (dbias) dbias[c] = store<G>(load(dbias[c]) + dw[C + c]);
    }
  }
}

template <class T, class G>
void bias_backward(G* dbias, const T* dout, int64_t N, int64_t OC) {
  const int nt = omp_get_max_threads();
  std::vector<float>& partial = partial_sums(static_cast<size_t>(nt) * OC);
#pragma omp parallel
  {
    float* p = partial.data() + static_cast<size_t>(omp_get_thread_num()) * OC;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* d = dout + n * OC;
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) p[o] += load(d[o]);
    }
  }
  for (int t = 0; t < nt; ++t) {
    const float* p = partial.data() + static_cast<size_t>(t) * OC;
    for (int64_t o = 0; o < OC; ++o) dbias[o] = store<G>(load(dbias[o]) + p[o]);
  }
}

#define INST_T(T)                                                                          \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, int64_t, \
                                     int64_t, float);
#define INST_TG(T, G)                                                                      \
  template void layernorm_backward<T, G>(T*, G*, G*, const T*, const T*, const T*,          \
                                         const float*, const float*, int64_t, int64_t);     \
  template void bias_backward<T, G>(G*, const T*, int64_t, int64_t);
KILN_CPU_FOR_EACH_T(INST_T)
KILN_CPU_FOR_EACH_TG(INST_TG)

}  // namespace kiln::cpu

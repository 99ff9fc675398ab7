// LayerNorm (Ba, Kiros, Hinton 2016) over the last dimension, with the backward of
// llm.c's layernorm_backward (dnorm, its mean and its projection on the normalised input).
// Parameter gradients are summed per thread into a private row, then reduced in thread
// order: deterministic for a fixed thread count.
#include "backend/cpu/kernels.h"

#include <omp.h>

#include <cmath>
#include <vector>

namespace kiln::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += x[c];
    const float m = s / static_cast<float>(C);
    float v = 0.f;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    const float r = 1.f / std::sqrt(v / static_cast<float>(C) + eps);
    float* o = out + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - m) * r * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = r;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t N, int64_t C) {
  const int nt = omp_get_max_threads();
  std::vector<float> partial(static_cast<size_t>(nt) * 2 * C, 0.f);
#pragma omp parallel
  {
    float* dw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
    float* db = dw + C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      const float m = mean[n], r = rstd[n];
      float dnorm_mean = 0.f, dnorm_norm_mean = 0.f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int64_t c = 0; c < C; ++c) {
        const float norm = (x[c] - m) * r;
        const float dnorm = dy[c] * weight[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= static_cast<float>(C);
      dnorm_norm_mean /= static_cast<float>(C);
      float* dx = dinp + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float norm = (x[c] - m) * r;
        const float dnorm = dy[c] * weight[c];
        dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
        dw[c] += norm * dy[c];
        db[c] += dy[c];
      }
    }
  }
  for (int t = 0; t < nt; ++t) {
    const float* dw = partial.data() + static_cast<size_t>(t) * 2 * C;
    for (int64_t c = 0; c < C; ++c) {
      dweight[c] += dw[c];
      dbias[c] += dw[C + c];
    }
  }
}

void bias_backward(float* dbias, const float* dout, int64_t N, int64_t OC) {
  const int nt = omp_get_max_threads();
  std::vector<float> partial(static_cast<size_t>(nt) * OC, 0.f);
#pragma omp parallel
  {
    float* p = partial.data() + static_cast<size_t>(omp_get_thread_num()) * OC;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* d = dout + n * OC;
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) p[o] += d[o];
    }
  }
  for (int t = 0; t < nt; ++t) {
    const float* p = partial.data() + static_cast<size_t>(t) * OC;
    for (int64_t o = 0; o < OC; ++o) dbias[o] += p[o];
  }
}

}  // namespace kiln::cpu

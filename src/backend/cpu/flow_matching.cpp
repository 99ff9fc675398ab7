// Rectified flow (Liu et al. 2023; Esser et al. 2024): the interpolated inputs and
// velocity targets of a batch, and the per-sample mean squared error with its gradient.
//
// rectified_flow_inputs is element-wise (each element read, then written: in-place use
// is safe). mse_loss sums each sample in fixed chunks of kChunk elements, in double,
// chunks added in order: the losses do not depend on the thread count. dpred is written
// in the same pass, right after its element is read (dpred may alias pred).
#include "backend/cpu/kernels.h"

#include <algorithm>
#include <vector>

namespace kiln::cpu {

namespace {
constexpr int64_t kChunk = 1 << 13;
}

void rectified_flow_inputs(float* xt, float* target, const float* images, const float* noise,
                           const float* t, int64_t B, int64_t n) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i) {
      const float tb = t[b];
      const int64_t k = b * n + i;
      const float x0 = images[k], x1 = noise[k];
      xt[k] = (1.f - tb) * x0 + tb * x1;
      target[k] = x1 - x0;
    }
}

template <class T>
void mse_loss(float* losses, T* dpred, const T* pred, const float* target, int64_t B, int64_t n,
              float grad_scale) {
  if (B <= 0 || n <= 0) return;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(B * chunks), 0.0);
  const double g = 2.0 * static_cast<double>(grad_scale) / static_cast<double>(n);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int64_t begin = b * n + ch * kChunk, end = b * n + std::min(n, (ch + 1) * kChunk);
      double s = 0.0;
      if (dpred) {
#pragma omp simd reduction(+ : s)
        for (int64_t i = begin; i < end; ++i) {
          const double d = static_cast<double>(load(pred[i])) - target[i];
          s += d * d;
          dpred[i] = store<T>(static_cast<float>(g * d));
        }
      } else {
#pragma omp simd reduction(+ : s)
        for (int64_t i = begin; i < end; ++i) {
          const double d = static_cast<double>(load(pred[i])) - target[i];
          s += d * d;
        }
      }
      partial[static_cast<size_t>(b * chunks + ch)] = s;
    }
  for (int64_t b = 0; b < B; ++b) {
    double s = 0.0;
    for (int64_t ch = 0; ch < chunks; ++ch) s += partial[static_cast<size_t>(b * chunks + ch)];
    losses[b] = static_cast<float>(s / static_cast<double>(n));
  }
}

#define INST_T(T) \
  template void mse_loss<T>(float*, T*, const T*, const float*, int64_t, int64_t, float);
KILN_CPU_FOR_EACH_T(INST_T)

}  // namespace kiln::cpu

// Softmax cross-entropy with an ignore index over the first V of Vp columns, rows in
// parallel. The gradient overwrites the logits row in place when dlogits aliases logits,
// so the caller's chunk of [rows, Vp] logits is the only such buffer that exists.
// Math: loss = logsumexp(x) - x_target; d loss / dx = softmax(x) - onehot(target).
#include "backend/cpu/kernels.h"

#include "backend/cpu/vec_math.h"
#include "core/error.h"

#include <cmath>

namespace kiln::cpu {

template <class T>
void softmax_cross_entropy(float* losses, T* dlogits, const T* logits, const int32_t* targets,
                           int64_t N, int64_t Vp, int V, int ignore_index, float grad_scale) {
  bool bad = false;
#pragma omp parallel for schedule(static) reduction(|| : bad)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * Vp;
    const int32_t t = targets[n];
    const bool ignored = t == ignore_index;
    if (!ignored && (t < 0 || t >= V)) {
      bad = true;
      continue;
    }
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, load(x[v]));
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t v = 0; v < V; ++v) sum += exp_approx(load(x[v]) - mx);
    const float lse = mx + std::log(sum);
    losses[n] = ignored ? 0.f : lse - load(x[t]);
    if (dlogits == nullptr) continue;
    T* d = dlogits + n * Vp;
    if (ignored) {
      for (int64_t v = 0; v < Vp; ++v) d[v] = store<T>(0.f);
      continue;
    }
    // The target's gradient is formed in fp32 before the one rounding to T.
    const float inv = grad_scale / sum;
    const float dt = exp_approx(load(x[t]) - mx) * inv - grad_scale;
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d[v] = store<T>(exp_approx(load(x[v]) - mx) * inv);
    for (int64_t v = V; v < Vp; ++v) d[v] = store<T>(0.f);
    d[t] = store<T>(dt);
  }
  KILN_CHECK(!bad, "softmax_cross_entropy: a target is outside [0, {}) and not the ignore index {}",
             V, ignore_index);
}

#define INST_T(T)                                                                        \
  template void softmax_cross_entropy<T>(float*, T*, const T*, const int32_t*, int64_t, int64_t, \
                                         int, int, float);
KILN_CPU_FOR_EACH_T(INST_T)

}  // namespace kiln::cpu

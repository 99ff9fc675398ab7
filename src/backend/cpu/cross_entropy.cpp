// Softmax cross-entropy with an ignore index over the first V of Vp columns, rows in
// parallel. The gradient overwrites the logits row in place when dlogits aliases logits,
// so the caller's chunk of [rows, Vp] logits is the only such buffer that exists.
// Math: loss = logsumexp(x) - x_target; d loss / dx = softmax(x) - onehot(target).
#include "backend/cpu/kernels.h"

#include "backend/cpu/vec_math.h"
#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace kiln::cpu {

namespace {
// max and sum of exp(x - max) over x[0, V) (V = 0: -inf and 0), in fixed SIMD order.
template <class T>
inline void row_max_sumexp(const T* x, int64_t V, float& mx, float& sum) {
  mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < V; ++v) mx = std::max(mx, load(x[v]));
  sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t v = 0; v < V; ++v) sum += exp_approx(load(x[v]) - mx);
}
}  // namespace

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
    float mx, sum;
    row_max_sumexp(x, V, mx, sum);
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

// Vocab-parallel cross-entropy: statistics of one rank's columns, then the gradient
// from the combined log-sum-exp (Megatron-LM's vocab_parallel_cross_entropy).
template <class T>
void cross_entropy_shard_stats(float* stats, const T* logits, const int32_t* targets, int64_t N,
                               int64_t Vl, int64_t vocab_begin, int valid) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * Vl;
    float mx, sum;
    row_max_sumexp(x, valid, mx, sum);
    const int64_t t = static_cast<int64_t>(targets[n]) - vocab_begin;
    stats[3 * n] = mx;
    stats[3 * n + 1] = sum;
    stats[3 * n + 2] = (t >= 0 && t < valid) ? load(x[t]) : 0.f;
  }
}

template <class T>
void cross_entropy_shard_backward(T* dlogits, const T* logits, const int32_t* targets,
                                  const float* lse, int64_t N, int64_t Vl, int64_t vocab_begin,
                                  int valid, int ignore_index, float grad_scale) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * Vl;
    T* d = dlogits + n * Vl;
    if (targets[n] == ignore_index) {
      for (int64_t v = 0; v < Vl; ++v) d[v] = store<T>(0.f);
      continue;
    }
    const int64_t t = static_cast<int64_t>(targets[n]) - vocab_begin;
    const float l = lse[n];
    // The target's gradient is formed in fp32 (read before the in-place write).
    const float dt = (t >= 0 && t < valid) ? exp_approx(load(x[t]) - l) * grad_scale - grad_scale : 0.f;
#pragma omp simd
    for (int64_t v = 0; v < valid; ++v) d[v] = store<T>(exp_approx(load(x[v]) - l) * grad_scale);
    for (int64_t v = valid; v < Vl; ++v) d[v] = store<T>(0.f);
    if (t >= 0 && t < valid) d[t] = store<T>(dt);
  }
}

#define INST_T(T)                                                                        \
  template void softmax_cross_entropy<T>(float*, T*, const T*, const int32_t*, int64_t, int64_t, \
                                         int, int, float);
KILN_CPU_FOR_EACH_T(INST_T)
#undef INST_T
#define INST_T(T)                                                                            \
  template void cross_entropy_shard_stats<T>(float*, const T*, const int32_t*, int64_t, int64_t, \
                                             int64_t, int);                                   \
  template void cross_entropy_shard_backward<T>(T*, const T*, const int32_t*, const float*,     \
                                                int64_t, int64_t, int64_t, int, int, float);
KILN_CPU_FOR_EACH_T(INST_T)

void accumulate_loss(double* acc, const float* losses, const int32_t* targets, int64_t n) {
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (targets[i] == -1) continue;
    sum += losses[i];
    ++count;
  }
  acc[0] += sum;
  acc[1] += static_cast<double>(count);
}

void cross_entropy_shard_combine(float* lse, double* acc, const float* stats,
                                 const int32_t* targets, int64_t N, int64_t tp) {
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) {
    double M = -INFINITY, S = 0.0, X = 0.0;
    for (int64_t q = 0; q < tp; ++q) M = std::max(M, double(stats[(q * N + i) * 3]));
    for (int64_t q = 0; q < tp; ++q) {
      const float* st = stats + (q * N + i) * 3;
      if (st[1] > 0.f) S += double(st[1]) * std::exp(double(st[0]) - M);
      X += st[2];
    }
    S = std::max(S, 1.0);  // >= 1 whenever computed: the maximum's own term is exp(0)
    lse[i] = static_cast<float>(M + std::log(S));
    if (targets[i] == -1) continue;
    sum += M + std::log(S) - X;
    ++count;
  }
  acc[0] += sum;
  acc[1] += static_cast<double>(count);
}

}  // namespace kiln::cpu

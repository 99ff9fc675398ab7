// Softmax cross-entropy, one block of 512 threads per row of the caller's chunk (the
// classifier passes row chunks, so only [chunk, Vp] logits ever exist; this kernel
// writes nothing beyond the given rows).
//   pass 1: each thread keeps an online (max, sum of exp) over its strided columns
//           (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"),
//           merged across the block -> lse; the target logit is read here, before any
//           in-place write.
//   pass 2: dlogits[v] = grad_scale * (exp(x_v - lse) - [v == target]), 0 for v >= V.
// Bytes: 2 Vp size read + Vp size written per row (pass 2 re-reads the row, mostly from
// L2 for chunk rows); ~5 Vp FLOPs + 2 Vp exp. As llm.c's fused classifier, without its
// fused loss-averaging.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cross_entropy.h"

#include <cmath>

namespace kiln::cuda {

namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

// The online (max, sum of exp) of columns [0, V) of one row x, merged over the block of
// kThreads in a fixed order; the result is valid in thread 0 only. Every thread of the
// block must call it (it synchronises the block).
template <class T>
__device__ void row_max_sumexp(const T* x, int V, float& M, float& S) {
  __shared__ float sm_m[kThreads / 32], sm_s[kThreads / 32];
  float m = -INFINITY, s = 0.f;
  for (int v = threadIdx.x; v < V; v += kThreads) {
    const float xv = to_f(x[v]);
    if (xv > m) {
      s = s * expf(m - xv) + 1.f;
      m = xv;
    } else {
      s += expf(xv - m);
    }
  }
  // Warp merge, then across warps (fixed order).
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm_m[warp] = m;
    sm_s[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    M = sm_m[0], S = sm_s[0];
    for (int w = 1; w < kThreads / 32; ++w) merge(M, S, sm_m[w], sm_s[w]);
  }
}

template <class T>
__global__ void xent_kernel(float* losses, T* dlogits, const T* logits, const int32_t* targets,
                            int64_t Vp, int V, int ignore_index, float grad_scale) {
  __shared__ float s_lse;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vp;
  const int32_t tgt = targets[row];
  const bool ignored = tgt == ignore_index;
  const bool bad = !ignored && (tgt < 0 || tgt >= V);
  // The target logit is read before any in-place write of the row.
  const float xt = (ignored || bad) ? 0.f : to_f(x[tgt]);
  float M, S;
  row_max_sumexp(x, V, M, S);
  if (threadIdx.x == 0) {
    s_lse = M + logf(S);
    losses[row] = ignored ? 0.f : bad ? NAN : s_lse - xt;
  }
  __syncthreads();
  if (dlogits == nullptr) return;
  T* d = dlogits + row * Vp;
  const float lse = s_lse;
  for (int64_t v = threadIdx.x; v < Vp; v += kThreads) {
    float g = 0.f;
    if (!ignored && v < V) g = expf(to_f(x[v]) - lse) * grad_scale - (v == tgt ? grad_scale : 0.f);
    d[v] = from_f<T>(bad ? NAN : g);
  }
}

// Vocab-parallel part 1: one block per row, the same online (max, sum) merge over the
// `valid` columns; the target's logit when this rank holds it.
template <class T>
__global__ void xent_shard_stats_kernel(float* stats, const T* logits, const int32_t* targets,
                                        int64_t Vl, int64_t vocab_begin, int valid) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vl;
  float M, S;
  row_max_sumexp(x, valid, M, S);
  if (threadIdx.x == 0) {
    const int64_t t = int64_t{targets[row]} - vocab_begin;
    stats[3 * row] = M;
    stats[3 * row + 1] = S;
    stats[3 * row + 2] = (t >= 0 && t < valid) ? to_f(x[t]) : 0.f;
  }
}

// Part 2: the gradient from the combined lse; each thread reads and then writes only its
// own columns, so dlogits may alias logits.
template <class T>
__global__ void xent_shard_backward_kernel(T* dlogits, const T* logits, const int32_t* targets,
                                           const float* lse, int64_t Vl, int64_t vocab_begin,
                                           int valid, int ignore_index, float grad_scale) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vl;
  T* d = dlogits + row * Vl;
  const bool ignored = targets[row] == ignore_index;
  const int64_t t = int64_t{targets[row]} - vocab_begin;
  const float l = lse[row];
  for (int64_t v = threadIdx.x; v < Vl; v += kThreads) {
    float g = 0.f;
    if (!ignored && v < valid) g = expf(to_f(x[v]) - l) * grad_scale - (v == t ? grad_scale : 0.f);
    d[v] = from_f<T>(g);
  }
}

}  // namespace

void softmax_cross_entropy(cudaStream_t s, Elem e, float* losses, void* dlogits,
                           const void* logits, const int32_t* targets, int64_t N, int64_t Vp,
                           int V, int ignore_index, float grad_scale) {
  if (N <= 0) return;
  KILN_DISPATCH_ELEM(e, xent_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
                            losses, static_cast<scalar_t*>(dlogits),
                            static_cast<const scalar_t*>(logits), targets, Vp, V, ignore_index,
                            grad_scale));
  KILN_CUDA_LAUNCHED("softmax_cross_entropy");
}

void cross_entropy_shard_stats(cudaStream_t s, Elem e, float* stats, const void* logits,
                               const int32_t* targets, int64_t N, int64_t Vl,
                               int64_t vocab_begin, int valid) {
  if (N <= 0) return;
  KILN_DISPATCH_ELEM(e, xent_shard_stats_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
                            stats, static_cast<const scalar_t*>(logits), targets, Vl, vocab_begin,
                            valid));
  KILN_CUDA_LAUNCHED("cross_entropy_shard_stats");
}

void cross_entropy_shard_backward(cudaStream_t s, Elem e, void* dlogits, const void* logits,
                                  const int32_t* targets, const float* lse, int64_t N,
                                  int64_t Vl, int64_t vocab_begin, int valid, int ignore_index,
                                  float grad_scale) {
  if (N <= 0) return;
  KILN_DISPATCH_ELEM(e, xent_shard_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
                            static_cast<scalar_t*>(dlogits), static_cast<const scalar_t*>(logits),
                            targets, lse, Vl, vocab_begin, valid, ignore_index, grad_scale));
  KILN_CUDA_LAUNCHED("cross_entropy_shard_backward");
}

}  // namespace kiln::cuda

// The mixture-of-experts router and its balancing statistics on the GPU: the CPU's math
// (src/backend/cpu/moe_router.cpp), one warp per token (4 tokens per 128-thread block).
//
// Forward: the warp scores its row of logits (softmax: max and sum by warp reductions;
// or the sigmoid of each), keeping the scores in shared memory, then takes k passes of
// a warp arg-max over the untaken experts of score + bias (fp32 sums, as the CPU's),
// each pass the CPU's strict left-to-right scan: the largest key, equal keys to the
// lower index, and a NaN key only when it is the first untaken one. Lane 0 then writes
// the k weights (renormalised in choice order, as the CPU). Shared memory 5 E bytes per
// warp. Backward: the score gradient in shared memory (4 E bytes per warp), lane 0 adds
// the weights' gradient in choice order, the warp applies the softmax or sigmoid
// Jacobian.
//
// Balancing statistics (moe_balance_stats): 1. one warp per row: its log-sum-exp and sum
// of sigmoids in double into scratch, the expert counts by integer atomics (exact in any
// order); 2. one block per expert (and one for z) sums its column over the rows in a
// fixed order (a block reduction in double) and adds it to load / prob / z once: no
// float atomics, bitwise reproducible. Backward: one warp per row, double inside, each
// term added to dlogits as the CPU does.
#include "backend/cuda/common.cuh"
#include "backend/cuda/moe_router.h"

#include <climits>

namespace kiln::cuda {

namespace {

constexpr float kRenormEps = 1e-20f;  // the CPU's guard of the renormalisation
constexpr int kWarps = 4;             // tokens per block
constexpr size_t kSharedBytes = 48 * 1024;

// Warps per block that fit `bytes_per_warp` of dynamic shared memory each.
int warps_for(size_t bytes_per_warp, const char* too_large) {
  for (int w = kWarps; w >= 1; w /= 2)
    if (bytes_per_warp * static_cast<size_t>(w) <= kSharedBytes) return w;
  fail(too_large);
}

__device__ __forceinline__ float logistic(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ double logistic(double x) { return 1.0 / (1.0 + exp(-x)); }

// One row of scores into s (shared) and out (global), lanes striding over the E experts.
__device__ void score_row(float* s, float* out, const float* l, int E, bool sigmoid) {
  const int lane = threadIdx.x & 31;
  if (sigmoid) {
    for (int e = lane; e < E; e += 32) s[e] = out[e] = logistic(l[e]);
    return;
  }
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float sum = 0.f;
  for (int e = lane; e < E; e += 32) sum += expf(l[e] - mx);
  const float inv = 1.f / warp_sum(sum);
  for (int e = lane; e < E; e += 32) s[e] = out[e] = expf(l[e] - mx) * inv;
}

// The untaken expert of largest key s[e] + bias[e] (every lane gets it), as the CPU's
// scan `best < 0 || key[e] > key[best]` over e ascending: a NaN key never wins unless it
// is the first untaken expert's, which then nothing beats.
__device__ int warp_top1(const float* s, const float* bias, const unsigned char* taken, int E) {
  const int lane = threadIdx.x & 31;
  float bv = 0.f;
  int bi = -1, first = INT_MAX;
  for (int e = lane; e < E; e += 32) {
    if (taken[e]) continue;
    if (first == INT_MAX) first = e;
    const float key = bias ? s[e] + bias[e] : s[e];
    if (!isnan(key) && (bi < 0 || key > bv)) bv = key, bi = e;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
  }
  const float fkey = bias ? s[first] + bias[first] : s[first];
  return isnan(fkey) ? first : bi;
}

__global__ void router_fwd(float* scores, int32_t* expert_idx, float* expert_weight,
                           const float* logits, const float* bias, int64_t N, int E, int k,
                           bool sigmoid, bool renormalize) {
  extern __shared__ float smem[];
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n = blockIdx.x * int64_t{warps} + warp;
  if (n >= N) return;
  float* s = smem + warp * E;
  unsigned char* taken = reinterpret_cast<unsigned char*>(smem + warps * E) + warp * E;
  score_row(s, scores + n * E, logits + n * E, E, sigmoid);
  for (int e = lane; e < E; e += 32) taken[e] = 0;
  __syncwarp();
  int32_t* idx = expert_idx + n * k;
  for (int j = 0; j < k; ++j) {
    const int best = warp_top1(s, bias, taken, E);
    if (lane == 0) idx[j] = best, taken[best] = 1;
    __syncwarp();
  }
  if (lane != 0) return;
  float* w = expert_weight + n * k;
  float sum = 0.f;
  for (int j = 0; j < k; ++j) sum += w[j] = s[idx[j]];
  if (!renormalize) return;
  const float denom = sum + kRenormEps;
  for (int j = 0; j < k; ++j) w[j] /= denom;
}

// ds[idx[j]] += the gradient of the k weights g (one thread, choice order as the CPU).
__device__ void add_weight_grad(float* ds, const float* s, const float* g, const int32_t* idx,
                                int E, int k, bool renormalize) {
  if (!renormalize) {
    for (int j = 0; j < k; ++j)
      if (idx[j] >= 0 && idx[j] < E) ds[idx[j]] += g[j];
    return;
  }
  // w_j = s_j / S: ds_j = (g_j - sum_l g_l w_l) / S.
  float S = 0.f;
  for (int j = 0; j < k; ++j)
    if (idx[j] >= 0 && idx[j] < E) S += s[idx[j]];
  S += kRenormEps;
  float gw = 0.f;
  for (int j = 0; j < k; ++j)
    if (idx[j] >= 0 && idx[j] < E) gw += g[j] * (s[idx[j]] / S);
  for (int j = 0; j < k; ++j)
    if (idx[j] >= 0 && idx[j] < E) ds[idx[j]] += (g[j] - gw) / S;
}

__global__ void router_bwd(float* dlogits, const float* dexpert_weight, const float* dscores,
                           const float* scores, const int32_t* expert_idx, int64_t N, int E,
                           int k, bool sigmoid, bool renormalize) {
  extern __shared__ float smem[];
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n = blockIdx.x * int64_t{warps} + warp;
  if (n >= N) return;
  float* ds = smem + warp * E;
  const float* s = scores + n * E;
  for (int e = lane; e < E; e += 32) ds[e] = dscores ? dscores[n * E + e] : 0.f;
  __syncwarp();
  if (lane == 0)
    add_weight_grad(ds, s, dexpert_weight + n * k, expert_idx + n * k, E, k, renormalize);
  __syncwarp();
  float* dl = dlogits + n * E;
  if (sigmoid) {
    for (int e = lane; e < E; e += 32) dl[e] = ds[e] * s[e] * (1.f - s[e]);
    return;
  }
  float dot = 0.f;
  for (int e = lane; e < E; e += 32) dot += ds[e] * s[e];
  dot = warp_sum(dot);
  for (int e = lane; e < E; e += 32) dl[e] = s[e] * (ds[e] - dot);
}

// A row's log-sum-exp and sum of sigmoids (the latter only for sigmoid scoring), in
// double; every lane of the warp gets them.
struct RowStats {
  double lse, S;
};
__device__ RowStats row_stats(const float* l, int E, bool sigmoid) {
  const int lane = threadIdx.x & 31;
  float mxf = -INFINITY;
  for (int e = lane; e < E; e += 32) mxf = fmaxf(mxf, l[e]);
  const double mx = warp_max(mxf);
  double sum = 0.0, S = 0.0;
  for (int e = lane; e < E; e += 32) {
    sum += exp(static_cast<double>(l[e]) - mx);
    if (sigmoid) S += logistic(static_cast<double>(l[e]));
  }
  return {mx + log(warp_sum(sum)), warp_sum(S)};
}

// Row n's balancing probability of expert e (softmax, or the normalised sigmoid).
__device__ __forceinline__ double balance_p(float l, const RowStats& r, bool sigmoid) {
  return sigmoid ? logistic(static_cast<double>(l)) / r.S : exp(static_cast<double>(l) - r.lse);
}

__global__ void balance_rows(double* lse, double* S, int* count, const float* logits,
                             const int32_t* expert_idx, int64_t N, int E, int64_t k,
                             bool sigmoid) {
  const int64_t n = blockIdx.x * int64_t{blockDim.x >> 5} + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const RowStats r = row_stats(logits + n * E, E, sigmoid);
  if (lane == 0) lse[n] = r.lse, S[n] = r.S;
  for (int64_t j = lane; j < k; j += 32) {
    const int32_t e = expert_idx[n * k + j];
    if (e >= 0 && e < E) atomicAdd(count + e, 1);
  }
}

// Block e < E: expert e's column; block E: z. Sums over the rows in a fixed order.
__global__ void balance_columns(float* load, float* prob, float* z, const float* logits,
                                const double* lse, const double* S, const int* count,
                                int64_t N, int E, bool sigmoid, float prob_scale,
                                float z_scale) {
  __shared__ double red[32];
  const int e = blockIdx.x;
  double sum = 0.0;
  if (e == E) {
    if (!z) return;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) sum += lse[n] * lse[n];
    sum = block_sum(sum, red);
    if (threadIdx.x == 0) z[0] += static_cast<float>(z_scale * sum);
    return;
  }
  if (prob) {
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x)
      sum += balance_p(logits[n * E + e], RowStats{lse[n], S[n]}, sigmoid);
    sum = block_sum(sum, red);
  }
  if (threadIdx.x != 0) return;
  if (load) load[e] += static_cast<float>(count[e]);
  if (prob) prob[e] += static_cast<float>(prob_scale * sum);
}

__global__ void balance_bwd(float* dlogits, const float* logits, const float* load, int64_t N,
                            int E, bool sigmoid, float aux_scale, float z_scale) {
  const int64_t n = blockIdx.x * int64_t{blockDim.x >> 5} + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const float* l = logits + n * E;
  float* dl = dlogits + n * E;
  const RowStats r = row_stats(l, E, sigmoid);
  if (load) {
    double gp = 0.0;  // sum_f g_f p_f
    for (int e = lane; e < E; e += 32)
      gp += static_cast<double>(aux_scale) * load[e] * balance_p(l[e], r, sigmoid);
    gp = warp_sum(gp);
    for (int e = lane; e < E; e += 32) {
      const double a = static_cast<double>(aux_scale) * load[e] - gp;
      double d = 0.0;
      if (sigmoid) {
        const double sg = logistic(static_cast<double>(l[e]));
        d = sg * (1.0 - sg) * a / r.S;
      } else {
        d = balance_p(l[e], r, false) * a;
      }
      dl[e] += static_cast<float>(d);
    }
  }
  if (z_scale == 0.f) return;
  for (int e = lane; e < E; e += 32)
    dl[e] += static_cast<float>(2.0 * z_scale * r.lse * exp(l[e] - r.lse));
}

unsigned blocks_for(int64_t N, int warps) { return static_cast<unsigned>((N + warps - 1) / warps); }

}  // namespace

void moe_router_forward(cudaStream_t s, float* scores, int32_t* expert_idx, float* expert_weight,
                        const float* logits, const float* bias, int64_t N, int64_t E, int k,
                        bool sigmoid, bool renormalize) {
  if (N <= 0) return;
  const size_t per_warp = static_cast<size_t>(E) * (sizeof(float) + 1);
  const int warps = warps_for(per_warp, "moe_router_forward: too many experts for the cuda "
                                        "kernel's shared memory (at most 9830)");
  router_fwd<<<blocks_for(N, warps), warps * 32, per_warp * warps, s>>>(
      scores, expert_idx, expert_weight, logits, bias, N, static_cast<int>(E), k, sigmoid,
      renormalize);
  KILN_CUDA_LAUNCHED("moe_router_forward");
}

void moe_router_backward(cudaStream_t s, float* dlogits, const float* dexpert_weight,
                         const float* dscores, const float* scores, const int32_t* expert_idx,
                         int64_t N, int64_t E, int k, bool sigmoid, bool renormalize) {
  if (N <= 0) return;
  const size_t per_warp = static_cast<size_t>(E) * sizeof(float);
  const int warps = warps_for(per_warp, "moe_router_backward: too many experts for the cuda "
                                        "kernel's shared memory (at most 12288)");
  router_bwd<<<blocks_for(N, warps), warps * 32, per_warp * warps, s>>>(
      dlogits, dexpert_weight, dscores, scores, expert_idx, N, static_cast<int>(E), k, sigmoid,
      renormalize);
  KILN_CUDA_LAUNCHED("moe_router_backward");
}

size_t moe_balance_scratch_bytes(int64_t N, int64_t E) {
  return sizeof(double) * 2 * static_cast<size_t>(N) + sizeof(int) * static_cast<size_t>(E);
}

void moe_balance_stats(cudaStream_t s, float* load, float* prob, float* z, const float* logits,
                       const int32_t* expert_idx, int64_t N, int64_t E, int64_t k, bool sigmoid,
                       float prob_scale, float z_scale, void* scratch) {
  if (!load && !prob && !z) return;
  double* lse = static_cast<double*>(scratch);
  double* S = lse + N;
  int* count = reinterpret_cast<int*>(S + N);
  KILN_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(int) * static_cast<size_t>(E), s));
  if (N > 0) {
    balance_rows<<<blocks_for(N, kWarps), kWarps * 32, 0, s>>>(lse, S, count, logits, expert_idx,
                                                               N, static_cast<int>(E), k, sigmoid);
    KILN_CUDA_LAUNCHED("moe_balance_stats rows");
  }
  balance_columns<<<static_cast<unsigned>(E + 1), 256, 0, s>>>(
      load, prob, z, logits, lse, S, count, N, static_cast<int>(E), sigmoid, prob_scale, z_scale);
  KILN_CUDA_LAUNCHED("moe_balance_stats columns");
}

void moe_balance_backward(cudaStream_t s, float* dlogits, const float* logits, const float* load,
                          int64_t N, int64_t E, bool sigmoid, float aux_scale, float z_scale) {
  if (N <= 0 || (!load && z_scale == 0.f)) return;
  balance_bwd<<<blocks_for(N, kWarps), kWarps * 32, 0, s>>>(
      dlogits, logits, load, N, static_cast<int>(E), sigmoid, aux_scale, z_scale);
  KILN_CUDA_LAUNCHED("moe_balance_backward");
}

}  // namespace kiln::cuda

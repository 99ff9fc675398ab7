// attention_decode: the KV-cache step of sampling (causal; multi-head or grouped-query:
// query head h reads cache head h / (NH / NKV)).
//   1. cache write: one thread per element of the new k and v rows (bytes 4 B Tq NKV HD
//      size).
//   2. one block of 128 threads per (query t, head h, batch b): the scores of the n =
//      past + t + 1 visible keys of its kv head go to dynamic shared memory (n floats),
//      then a block max and sum, then thread d of the head accumulates sum_j p_j v_j[d]
//      (coalesced reads of each cache row). Bytes: 2 n HD size per (b, h, t) (k and v
//      of the visible rows); FLOPs 4 n HD. Memory-bound, as decoding is; no T x T matrix.
#include "backend/cuda/attention_decode.h"
#include "backend/cuda/common.cuh"

#include <cmath>

namespace kiln::cuda {

namespace {

// qkv rows of W columns: q heads (CQ columns), k heads (KV), v heads (KV).
template <class T>
__global__ void cache_write(T* kc, T* vc, const T* qkv, int64_t B, int64_t Tq, int64_t Tmax,
                            int64_t W, int64_t CQ, int64_t KV, int64_t past) {
  const int64_t n = B * Tq * KV;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = e / KV, c = e % KV, b = bt / Tq, t = bt % Tq;
    const int64_t dst = (b * Tmax + past + t) * KV + c;
    kc[dst] = qkv[bt * W + CQ + c];
    vc[dst] = qkv[bt * W + CQ + KV + c];
  }
}

template <class T>
__global__ void decode_kernel(T* out, const T* kc, const T* vc, const T* qkv, int64_t Tq,
                              int64_t Tmax, int64_t W, int64_t CQ, int64_t KV, int64_t HD,
                              int64_t group, int64_t past, float scale) {
  extern __shared__ float sc[];
  __shared__ float red[32];
  const int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / group;
  const int64_t n = past + t + 1;
  const T* q = qkv + (b * Tq + t) * W + h * HD;
  const T* kb = kc + b * Tmax * KV + kvh * HD;
  const T* vb = vc + b * Tmax * KV + kvh * HD;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float s = 0.f;
    for (int64_t d = 0; d < HD; ++d) s += to_f(q[d]) * to_f(kb[j * KV + d]);
    s *= scale;
    sc[j] = s;
    mx = fmaxf(mx, s);
  }
  // block max
  mx = warp_max(mx);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = lane < nw ? red[lane] : -INFINITY;
  mx = warp_max(mx);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float p = expf(sc[j] - mx);
    sc[j] = p;
    sum += p;
  }
  sum = block_sum(sum, red);  // syncs before reusing red; also orders the sc writes
  __syncthreads();
  const float inv = 1.f / sum;
  for (int64_t d = threadIdx.x; d < HD; d += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < n; ++j) acc += sc[j] * to_f(vb[j * KV + d]);
    out[(b * Tq + t) * CQ + h * HD + d] = from_f<T>(acc * inv);
  }
}

}  // namespace

void attention_decode(cudaStream_t s, Elem e, void* out, void* k_cache, void* v_cache,
                      const void* qkv, int64_t B, int64_t Tq, int64_t Tmax, int64_t NH,
                      int64_t NKV, int64_t HD, int64_t past) {
  if (B * Tq * NH * HD == 0) return;
  const int64_t CQ = NH * HD, KV = NKV * HD, W = CQ + 2 * KV;
  // Rounded up to whole groups of 4 floats: the compiler may load the 1-3 scores of the
  // P V loop's remainder as one speculative group (compute-sanitizer's memcheck saw a
  // 12-byte read past an unpadded array on an H200, 2026-11-30).
  const size_t smem = sizeof(float) * static_cast<size_t>((past + Tq + 3) / 4 * 4);
  int dev = 0, max_smem = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (smem + 32 * sizeof(float) > static_cast<size_t>(max_smem))
    fail("cuda: attention_decode: the cache is too long for one block's shared memory");
  const float scale = 1.f / sqrtf(static_cast<float>(HD));
  const dim3 grid(static_cast<unsigned>(Tq), static_cast<unsigned>(NH), static_cast<unsigned>(B));
  KILN_DISPATCH_ELEM(e, {
    auto* kc = static_cast<scalar_t*>(k_cache);
    auto* vc = static_cast<scalar_t*>(v_cache);
    const auto* x = static_cast<const scalar_t*>(qkv);
    cache_write<<<grid_for(B * Tq * KV, 256), 256, 0, s>>>(kc, vc, x, B, Tq, Tmax, W, CQ, KV,
                                                           past);
    KILN_CUDA_LAUNCHED("attention_decode (cache)");
    if (smem > 48 * 1024)
      KILN_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<scalar_t>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
    decode_kernel<<<grid, 128, smem, s>>>(static_cast<scalar_t*>(out), kc, vc, x, Tq, Tmax, W,
                                          CQ, KV, HD, NH / NKV, past, scale);
    KILN_CUDA_LAUNCHED("attention_decode");
  });
}

}  // namespace kiln::cuda

// Device helpers shared by the .cu files: fp32/bf16 loads and stores (every kernel
// computes in fp32), warp and block reductions, Philox-4x32-10 identical to
// src/core/rng.cpp (so that dropout masks match the CPU backend bit for bit), and the
// dispatch from Elem to a template instantiation.
#pragma once

#include "backend/cuda/common.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
/// `scratch` holds 32 values. Fixed order: deterministic.
template <class V>
__device__ __forceinline__ V block_sum(V v, V* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : V(0);
  return warp_sum(v);
}

// ---- Philox-4x32-10 (Salmon et al. 2011), kiln's counter convention (core/rng.h) ----
struct Philox4 {
  uint32_t x, y, z, w;
  __device__ __forceinline__ uint32_t operator[](int i) const {
    return i == 0 ? x : i == 1 ? y : i == 2 ? z : w;
  }
};

__device__ __forceinline__ Philox4 philox_block(uint64_t seed, uint64_t stream, uint64_t block) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return {c0, c1, c2, c3};
}

/// uint32 -> uniform [0, 1) with 24 bits, exactly as core/rng.h's u32_to_uniform.
__device__ __forceinline__ float u32_to_uniform(uint32_t x) {
  return static_cast<float>(x >> 8) * 0x1p-24f;
}

/// Element `index` of a Philox stream as a uniform (one Philox call per element: for
/// runs of consecutive indices prefer philox_block and use its four words).
__device__ __forceinline__ float uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return u32_to_uniform(philox_block(seed, stream, index >> 2)[static_cast<int>(index & 3)]);
}

/// fn.template operator()<D>() for the smallest D of 16, 32, 64, 128 that holds head size
/// hd (<= 128): the attention kernels' register and shared tiles, zero-padded past hd.
template <class Fn>
void dispatch_head_dim(int64_t hd, Fn&& fn) {
  if (hd <= 16) fn.template operator()<16>();
  else if (hd <= 32) fn.template operator()<32>();
  else if (hd <= 64) fn.template operator()<64>();
  else fn.template operator()<128>();
}

}  // namespace kiln::cuda

/// Calls F.template operator()<float or bf16>() for an Elem.
#define KILN_DISPATCH_ELEM(elem, ...)                        \
  do {                                                        \
    if ((elem) == ::kiln::cuda::Elem::F32) {                  \
      using scalar_t = float;                                 \
      __VA_ARGS__;                                            \
    } else {                                                  \
      using scalar_t = ::kiln::cuda::bf16;                    \
      __VA_ARGS__;                                            \
    }                                                         \
  } while (0)

/// The same for a parameter gradient's element type, as `grad_t` (mixed precision: bf16
/// activations with fp32 gradients). Nests inside KILN_DISPATCH_ELEM.
#define KILN_DISPATCH_GRAD(elem, ...)                        \
  do {                                                        \
    if ((elem) == ::kiln::cuda::Elem::F32) {                  \
      using grad_t = float;                                   \
      __VA_ARGS__;                                            \
    } else {                                                  \
      using grad_t = ::kiln::cuda::bf16;                      \
      __VA_ARGS__;                                            \
    }                                                         \
  } while (0)

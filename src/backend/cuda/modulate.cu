// DiT's adaLN modulation and gate (Peebles & Xie 2023): a per-sample chunk of the
// conditioning vector broadcast over the T positions.
//
// Forward: grid-stride element-wise, 256 threads; bytes (2 n + chunks B C) size, 2-3
// FLOPs per element; each element read and written by one thread (out may alias x).
// Backward: block (32, kRows) per (32 channels, sample): lane x owns channel c, the
// kRows thread rows walk t = y, y + kRows, ... reading dout and x coalesced along c,
// writing dx right after reading dout (same thread, same element: dx may alias dout)
// and keeping fp32 partial sums; the kRows partials of each channel are then added in
// row order in shared memory (deterministic, no atomics) and written once to dmod.
// Bytes (3 n + 3 B C) size, 4 FLOPs per element.
#include "backend/cuda/common.cuh"
#include "backend/cuda/modulate.h"

namespace kiln::cuda {

namespace {

constexpr int kRows = 8;

template <class T>
__global__ void modulate_kernel(T* out, const T* x, const T* mod, int64_t T_, int64_t C,
                                int64_t M, int64_t scale, int64_t shift, float scale_offset,
                                int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % C, b = i / (T_ * C);
    const T* m = mod + b * M * C + c;
    float y = to_f(x[i]) * (scale_offset + to_f(m[scale * C]));
    if (shift >= 0) y += to_f(m[shift * C]);
    out[i] = from_f<T>(y);
  }
}

template <class T>
__global__ void modulate_backward_kernel(T* dx, T* dmod, const T* dout, const T* x, const T* mod,
                                         int64_t B, int64_t T_, int64_t C, int64_t M,
                                         int64_t scale, int64_t shift, float scale_offset) {
  __shared__ float s_scale[kRows][32];
  __shared__ float s_shift[kRows][32];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  const bool active = c < C;
  // Samples beyond gridDim.y (at most 65535) by a block-uniform loop.
  for (int64_t b = blockIdx.y; b < B; b += gridDim.y) {
    float ds = 0.f, dh = 0.f;
    if (active) {
      const float factor = scale_offset + to_f(mod[(b * M + scale) * C + c]);
      for (int64_t t = threadIdx.y; t < T_; t += kRows) {
        const int64_t i = (b * T_ + t) * C + c;
        const float d = to_f(dout[i]);
        ds += d * to_f(x[i]);
        dh += d;
        if (dx) dx[i] = from_f<T>(d * factor);
      }
    }
    __syncthreads();  // the previous sample's sums have been read
    s_scale[threadIdx.y][threadIdx.x] = ds;
    s_shift[threadIdx.y][threadIdx.x] = dh;
    __syncthreads();
    if (threadIdx.y == 0 && active) {
      float s1 = 0.f, s2 = 0.f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        s1 += s_scale[r][threadIdx.x];
        s2 += s_shift[r][threadIdx.x];
      }
      dmod[(b * M + scale) * C + c] = from_f<T>(s1);
      if (shift >= 0) dmod[(b * M + shift) * C + c] = from_f<T>(s2);
    }
  }
}

}  // namespace

void modulate(cudaStream_t s, Elem e, void* out, const void* x, const void* mod, int64_t B,
              int64_t T, int64_t C, int64_t M, int64_t scale, int64_t shift, float scale_offset) {
  const int64_t n = B * T * C;
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, modulate_kernel<<<grid_for(n, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(out), static_cast<const scalar_t*>(x),
                            static_cast<const scalar_t*>(mod), T, C, M, scale, shift,
                            scale_offset, n));
  KILN_CUDA_LAUNCHED("modulate");
}

void modulate_backward(cudaStream_t s, Elem e, void* dx, void* dmod, const void* dout,
                       const void* x, const void* mod, int64_t B, int64_t T, int64_t C, int64_t M,
                       int64_t scale, int64_t shift, float scale_offset) {
  if (B <= 0 || C <= 0) return;
  const dim3 grid(static_cast<unsigned>((C + 31) / 32),
                  static_cast<unsigned>(B < 65535 ? B : 65535));
  const dim3 block(32, kRows);
  KILN_DISPATCH_ELEM(e, modulate_backward_kernel<<<grid, block, 0, s>>>(
                            static_cast<scalar_t*>(dx), static_cast<scalar_t*>(dmod),
                            static_cast<const scalar_t*>(dout), static_cast<const scalar_t*>(x),
                            static_cast<const scalar_t*>(mod), B, T, C, M, scale, shift,
                            scale_offset));
  KILN_CUDA_LAUNCHED("modulate_backward");
}

}  // namespace kiln::cuda

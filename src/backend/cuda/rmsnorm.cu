// RMSNorm kernels (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"; as
// Llama's): y = x rstd w, rstd = 1/sqrt(mean(x^2) + eps). The structure of layernorm.cu.
//
// Forward: one warp per row (4 rows per 128-thread block): the sum of squares, then the
// output, the row re-read from L1/L2. DRAM bytes N C size read + N C size written + 4 N
// (rstd); ~4 N C FLOPs.
//
// Backward (the CPU's math, src/backend/cpu/rmsnorm.cpp):
//   dx_j = rstd (w_j g_j - x_j rstd^2 mean_i(w_i g_i x_i)),  dw_j += sum_n g_j x_j rstd.
//   1. dinp: one warp per row, dinp[n] += dx. Bytes: 3 N C size read (dout, inp, dinp)
//      + N C written.
//   2. dweight partials: block (32 columns x 8 row lanes) per (column tile, chunk of 64
//      rows) writes partial[chunk][c]. Bytes: 2 N C size read.
//   3. one thread per column sums the partials in chunk order and adds them into dweight.
//      No atomics: bitwise reproducible.
// Without a weight the kernels take w = 1 (a template flag) and there is no dweight.
#include "backend/cuda/common.cuh"
#include "backend/cuda/rmsnorm.h"

namespace kiln::cuda {

namespace {

constexpr int kRowsPerChunk = 64;

template <class T, bool kWeight>
__global__ void rms_fwd(T* out, float* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                        float eps) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* x = inp + row * C;
  float ss = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float v = to_f(x[c]);
    ss += v * v;
  }
  const float r = 1.f / sqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  T* o = out + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    float y = to_f(x[c]) * r;
    if constexpr (kWeight) y *= to_f(weight[c]);
    o[c] = from_f<T>(y);
  }
  if (lane == 0) rstd[row] = r;
}

template <class T, bool kWeight>
__global__ void rms_bwd_dinp(T* dinp, const T* dout, const T* inp, const T* weight,
                             const float* rstd, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* x = inp + row * C;
  const T* dy = dout + row * C;
  const float r = rstd[row];
  float a = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float wg = kWeight ? to_f(dy[c]) * to_f(weight[c]) : to_f(dy[c]);
    a += wg * to_f(x[c]);
  }
  const float k = r * r * warp_sum(a) / static_cast<float>(C);
  T* dx = dinp + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float wg = kWeight ? to_f(dy[c]) * to_f(weight[c]) : to_f(dy[c]);
    dx[c] = from_f<T>(to_f(dx[c]) + r * (wg - to_f(x[c]) * k));
  }
}

// blockDim (32, 8); grid (column tiles, chunks).
template <class T>
__global__ void rms_bwd_weight_partial(float* pw, const T* dout, const T* inp, const float* rstd,
                                       int64_t N, int64_t C) {
  __shared__ float sw[8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  const int64_t r0 = blockIdx.y * int64_t{kRowsPerChunk};
  const int64_t r1 = r0 + kRowsPerChunk < N ? r0 + kRowsPerChunk : N;
  float aw = 0.f;
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8)
      aw += to_f(dout[r * C + c]) * to_f(inp[r * C + c]) * rstd[r];
  sw[threadIdx.y][threadIdx.x] = aw;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float w = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) w += sw[k][threadIdx.x];
    pw[blockIdx.y * C + c] = w;
  }
}

template <class G>
__global__ void rms_bwd_weight_final(G* dweight, const float* pw, int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float w = 0.f;
  for (int64_t k = 0; k < chunks; ++k) w += pw[k * C + c];
  dweight[c] = from_f<G>(to_f(dweight[c]) + w);
}

int64_t chunks_of(int64_t N) { return (N + kRowsPerChunk - 1) / kRowsPerChunk; }

}  // namespace

void rmsnorm_forward(cudaStream_t s, Elem e, void* out, float* rstd, const void* inp,
                     const void* weight, int64_t N, int64_t C, float eps) {
  if (N <= 0) return;
  const unsigned blocks = static_cast<unsigned>((N + 3) / 4);
  KILN_DISPATCH_ELEM(e, {
    auto* o = static_cast<scalar_t*>(out);
    const auto* x = static_cast<const scalar_t*>(inp);
    const auto* w = static_cast<const scalar_t*>(weight);
    if (w) rms_fwd<scalar_t, true><<<blocks, 128, 0, s>>>(o, rstd, x, w, N, C, eps);
    else rms_fwd<scalar_t, false><<<blocks, 128, 0, s>>>(o, rstd, x, w, N, C, eps);
  });
  KILN_CUDA_LAUNCHED("rmsnorm_forward");
}

size_t rmsnorm_backward_scratch_bytes(int64_t N, int64_t C) {
  return sizeof(float) * static_cast<size_t>(chunks_of(N) * C);
}

void rmsnorm_backward(cudaStream_t s, Elem e, Elem g, void* dinp, void* dweight,
                      const void* dout, const void* inp, const void* weight, const float* rstd,
                      int64_t N, int64_t C, void* scratch) {
  if (N <= 0 || C <= 0) return;
  const int64_t chunks = chunks_of(N);
  float* pw = static_cast<float*>(scratch);
  KILN_DISPATCH_ELEM(e, {
    const auto* dy = static_cast<const scalar_t*>(dout);
    const auto* x = static_cast<const scalar_t*>(inp);
    const auto* w = static_cast<const scalar_t*>(weight);
    auto* dx = static_cast<scalar_t*>(dinp);
    const unsigned blocks = static_cast<unsigned>((N + 3) / 4);
    if (w) rms_bwd_dinp<scalar_t, true><<<blocks, 128, 0, s>>>(dx, dy, x, w, rstd, N, C);
    else rms_bwd_dinp<scalar_t, false><<<blocks, 128, 0, s>>>(dx, dy, x, w, rstd, N, C);
    KILN_CUDA_LAUNCHED("rmsnorm_backward (dinp)");
    if (!dweight) return;
    rms_bwd_weight_partial<<<dim3(static_cast<unsigned>((C + 31) / 32),
                                  static_cast<unsigned>(chunks)),
                             dim3(32, 8), 0, s>>>(pw, dy, x, rstd, N, C);
    KILN_CUDA_LAUNCHED("rmsnorm_backward (partials)");
  });
  KILN_DISPATCH_GRAD(g, rms_bwd_weight_final<<<grid_for(C, 256), 256, 0, s>>>(
                            static_cast<grad_t*>(dweight), pw, chunks, C));
  KILN_CUDA_LAUNCHED("rmsnorm_backward (dweight)");
}

}  // namespace kiln::cuda

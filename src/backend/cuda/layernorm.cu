// LayerNorm kernels.
//
// Forward: one warp per row (4 rows per 128-thread block). Two passes over the row for
// the mean and the (biased) variance, as the CPU backend, then the normalised output;
// the row is re-read from L1/L2, so DRAM bytes are N C size read + N C size written +
// 8 N (mean, rstd); ~8 N C FLOPs.
//
// Backward (llm.c's layernorm_backward math: dnorm, its mean and its projection on the
// normalised input), split so that every sum has a fixed order:
//   1. dinp: one warp per row, dinp[n] += (dnorm - mean(dnorm) - norm mean(dnorm norm))
//      rstd. Bytes: 3 N C size read (dout, inp, dinp) + N C written.
//   2. dweight/dbias partials: block (32 columns x 8 row lanes) per (column tile, chunk
//      of 64 rows); writes partial[chunk][c] for both sums. Bytes: 2 N C size read.
//   3. one thread per column sums the partials in chunk order and adds them into
//      dweight / dbias (fp32 or bf16, independent of the activations' type). No atomics:
//      the result is bitwise reproducible.
// Without a weight (no scale) or a bias (no shift), the kernels take 1 and 0 instead
// (template flags, so that the affine case compiles to the same code), and the missing
// parameter's gradient is not written.
#include "backend/cuda/common.cuh"
#include "backend/cuda/layernorm.h"

namespace kiln::cuda {

namespace {

constexpr int kRowsPerChunk = 64;

template <class T, bool kWeight, bool kBias>
__global__ void ln_fwd(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                       const T* bias, int64_t N, int64_t C, float eps) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* x = inp + row * C;
  float s = 0.f;
  for (int64_t c = lane; c < C; c += 32) s += to_f(x[c]);
  const float m = warp_sum(s) / static_cast<float>(C);
  float v = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = to_f(x[c]) - m;
    v += d * d;
  }
  const float r = 1.f / sqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  T* o = out + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    float y = (to_f(x[c]) - m) * r;
    if constexpr (kWeight && kBias) {
      y = (to_f(x[c]) - m) * r * to_f(weight[c]) + to_f(bias[c]);
    } else {
      if constexpr (kWeight) y *= to_f(weight[c]);
      if constexpr (kBias) y += to_f(bias[c]);
    }
    o[c] = from_f<T>(y);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

template <class T, bool kWeight>
__global__ void ln_bwd_dinp(T* dinp, const T* dout, const T* inp, const T* weight,
                            const float* mean, const float* rstd, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* x = inp + row * C;
  const T* dy = dout + row * C;
  const float m = mean[row], r = rstd[row];
  float a = 0.f, b = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float norm = (to_f(x[c]) - m) * r;
    const float dnorm = kWeight ? to_f(dy[c]) * to_f(weight[c]) : to_f(dy[c]);
    a += dnorm;
    b += dnorm * norm;
  }
  const float dnorm_mean = warp_sum(a) / static_cast<float>(C);
  const float dnorm_norm_mean = warp_sum(b) / static_cast<float>(C);
  T* dx = dinp + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float norm = (to_f(x[c]) - m) * r;
    const float dnorm = kWeight ? to_f(dy[c]) * to_f(weight[c]) : to_f(dy[c]);
    dx[c] = from_f<T>(to_f(dx[c]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r);
  }
}

// blockDim (32, 8); grid (column tiles, chunks).
template <class T>
__global__ void ln_bwd_params_partial(float* pw, float* pb, const T* dout, const T* inp,
                                      const float* mean, const float* rstd, int64_t N,
                                      int64_t C) {
  __shared__ float sw[8][33], sb[8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  const int64_t r0 = blockIdx.y * int64_t{kRowsPerChunk};
  const int64_t r1 = r0 + kRowsPerChunk < N ? r0 + kRowsPerChunk : N;
  float aw = 0.f, ab = 0.f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const float dy = to_f(dout[r * C + c]);
      aw += dy * (to_f(inp[r * C + c]) - mean[r]) * rstd[r];
      ab += dy;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float w = 0.f, b = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      w += sw[k][threadIdx.x];
      b += sb[k][threadIdx.x];
    }
    pw[blockIdx.y * C + c] = w;
    pb[blockIdx.y * C + c] = b;
  }
}

template <class G>
__global__ void ln_bwd_params_final(G* dweight, G* dbias, const float* pw, const float* pb,
                                    int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float w = 0.f, b = 0.f;
  for (int64_t k = 0; k < chunks; ++k) {
    w += pw[k * C + c];
    b += pb[k * C + c];
  }
  if (dweight) dweight[c] = from_f<G>(to_f(dweight[c]) + w);
  if (dbias) dbias[c] = from_f<G>(to_f(dbias[c]) + b);
}

int64_t chunks_of(int64_t N) { return (N + kRowsPerChunk - 1) / kRowsPerChunk; }

}  // namespace

void layernorm_forward(cudaStream_t s, Elem e, void* out, float* mean, float* rstd,
                       const void* inp, const void* weight, const void* bias, int64_t N,
                       int64_t C, float eps) {
  if (N <= 0) return;
  const unsigned blocks = static_cast<unsigned>((N + 3) / 4);
  KILN_DISPATCH_ELEM(e, {
    auto* o = static_cast<scalar_t*>(out);
    const auto* x = static_cast<const scalar_t*>(inp);
    const auto* w = static_cast<const scalar_t*>(weight);
    const auto* b = static_cast<const scalar_t*>(bias);
    if (w && b)
      ln_fwd<scalar_t, true, true><<<blocks, 128, 0, s>>>(o, mean, rstd, x, w, b, N, C, eps);
    else if (w)
      ln_fwd<scalar_t, true, false><<<blocks, 128, 0, s>>>(o, mean, rstd, x, w, b, N, C, eps);
    else if (b)
      ln_fwd<scalar_t, false, true><<<blocks, 128, 0, s>>>(o, mean, rstd, x, w, b, N, C, eps);
    else
      ln_fwd<scalar_t, false, false><<<blocks, 128, 0, s>>>(o, mean, rstd, x, w, b, N, C, eps);
  });
  KILN_CUDA_LAUNCHED("layernorm_forward");
}

size_t layernorm_backward_scratch_bytes(int64_t N, int64_t C) {
  return sizeof(float) * 2 * static_cast<size_t>(chunks_of(N) * C);
}

void layernorm_backward(cudaStream_t s, Elem e, Elem g, void* dinp, void* dweight, void* dbias,
                        const void* dout, const void* inp, const void* weight, const float* mean,
                        const float* rstd, int64_t N, int64_t C, void* scratch) {
  if (N <= 0 || C <= 0) return;
  const int64_t chunks = chunks_of(N);
  float* pw = static_cast<float*>(scratch);
  float* pb = pw + chunks * C;
  KILN_DISPATCH_ELEM(e, {
    const auto* dy = static_cast<const scalar_t*>(dout);
    const auto* x = static_cast<const scalar_t*>(inp);
    const auto* w = static_cast<const scalar_t*>(weight);
    const unsigned blocks = static_cast<unsigned>((N + 3) / 4);
    if (w)
      ln_bwd_dinp<scalar_t, true><<<blocks, 128, 0, s>>>(static_cast<scalar_t*>(dinp), dy, x, w,
                                                         mean, rstd, N, C);
    else
      ln_bwd_dinp<scalar_t, false><<<blocks, 128, 0, s>>>(static_cast<scalar_t*>(dinp), dy, x, w,
                                                          mean, rstd, N, C);
    KILN_CUDA_LAUNCHED("layernorm_backward (dinp)");
    if (!dweight && !dbias) return;
    ln_bwd_params_partial<<<dim3(static_cast<unsigned>((C + 31) / 32),
                                 static_cast<unsigned>(chunks)),
                            dim3(32, 8), 0, s>>>(pw, pb, dy, x, mean, rstd, N, C);
    KILN_CUDA_LAUNCHED("layernorm_backward (partials)");
  });
  KILN_DISPATCH_GRAD(g, ln_bwd_params_final<<<grid_for(C, 256), 256, 0, s>>>(
                            static_cast<grad_t*>(dweight), static_cast<grad_t*>(dbias), pw, pb,
                            chunks, C));
  KILN_CUDA_LAUNCHED("layernorm_backward (params)");
}

}  // namespace kiln::cuda

// GELU (tanh form, as GPT-2 and torch's gelu(approximate="tanh")), element-wise.
// Launch: grid-stride, 256 threads, up to 2^20 blocks. Memory-bound:
//   forward  bytes 2 n size (read x, write y), ~10 FLOPs + one tanhf per element;
//   backward bytes 3 n size (read x, dy, write dx), ~18 FLOPs + one tanhf.
// Idea as llm.c's gelu_forward/backward kernels; tanhf (not __tanhf) keeps fp32 results
// within a few ulps of the CPU reference.
#include "backend/cuda/common.cuh"
#include "backend/cuda/gelu.h"

namespace kiln::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;

template <class T>
__global__ void gelu_fwd(T* out, const T* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = to_f(inp[i]);
    const float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    out[i] = from_f<T>(0.5f * x * (1.f + tanhf(u)));
  }
}

template <class T>
__global__ void gelu_bwd(T* dinp, const T* dout, const T* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = to_f(inp[i]);
    const float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    const float th = tanhf(u);
    const float sech2 = 1.f - th * th;
    const float du = kSqrt2OverPi * (1.f + 3.f * 0.044715f * x * x);
    dinp[i] = from_f<T>(to_f(dout[i]) * (0.5f * (1.f + th) + 0.5f * x * sech2 * du));
  }
}

}  // namespace

void gelu_forward(cudaStream_t s, Elem e, void* out, const void* inp, int64_t n) {
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, gelu_fwd<<<grid_for(n, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(out), static_cast<const scalar_t*>(inp), n));
  KILN_CUDA_LAUNCHED("gelu_forward");
}

void gelu_backward(cudaStream_t s, Elem e, void* dinp, const void* dout, const void* inp,
                   int64_t n) {
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, gelu_bwd<<<grid_for(n, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(dinp), static_cast<const scalar_t*>(dout),
                            static_cast<const scalar_t*>(inp), n));
  KILN_CUDA_LAUNCHED("gelu_backward");
}

}  // namespace kiln::cuda

// SwiGLU, element-wise over the N H outputs: silu(g) u with silu(g) = g sigmoid(g), the
// gate g in columns [0,H) of a row of inp and the up projection u in [H,2H). Launch:
// grid-stride, 256 threads, up to 2^20 blocks. Memory-bound:
//   forward  bytes 3 N H size (read g, u, write y), ~6 FLOPs + one expf per element;
//   backward bytes 5 N H size (read g, u, dy, write dg, du), ~10 FLOPs + one expf.
// The sigmoid from e = exp(-|g|) in (0, 1] never overflows (the CPU's formula, with
// expf instead of its polynomial exp).
#include "backend/cuda/common.cuh"
#include "backend/cuda/swiglu.h"

namespace kiln::cuda {

namespace {

__device__ __forceinline__ float sigmoid(float x) {
  const float e = expf(-fabsf(x));
  return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

template <class T>
__global__ void swiglu_fwd(T* out, const T* inp, int64_t N, int64_t H) {
  const int64_t n = N * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / H, j = i % H;
    const T* gate = inp + row * 2 * H;
    const float g = to_f(gate[j]), u = to_f(gate[H + j]);
    out[i] = from_f<T>(g * sigmoid(g) * u);
  }
}

template <class T>
__global__ void swiglu_bwd(T* dinp, const T* dout, const T* inp, int64_t N, int64_t H) {
  const int64_t n = N * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / H, j = i % H;
    const T* gate = inp + row * 2 * H;
    const float g = to_f(gate[j]), u = to_f(gate[H + j]), d = to_f(dout[i]);
    const float sg = sigmoid(g);
    T* dg = dinp + row * 2 * H;
    dg[j] = from_f<T>(d * u * sg * (1.f + g * (1.f - sg)));  // d silu/dg = sg (1 + g (1 - sg))
    dg[H + j] = from_f<T>(d * g * sg);
  }
}

}  // namespace

void swiglu_forward(cudaStream_t s, Elem e, void* out, const void* inp, int64_t N, int64_t H) {
  if (N * H <= 0) return;
  KILN_DISPATCH_ELEM(e, swiglu_fwd<<<grid_for(N * H, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(out), static_cast<const scalar_t*>(inp), N, H));
  KILN_CUDA_LAUNCHED("swiglu_forward");
}

void swiglu_backward(cudaStream_t s, Elem e, void* dinp, const void* dout, const void* inp,
                     int64_t N, int64_t H) {
  if (N * H <= 0) return;
  KILN_DISPATCH_ELEM(e, swiglu_bwd<<<grid_for(N * H, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(dinp), static_cast<const scalar_t*>(dout),
                            static_cast<const scalar_t*>(inp), N, H));
  KILN_CUDA_LAUNCHED("swiglu_backward");
}

}  // namespace kiln::cuda

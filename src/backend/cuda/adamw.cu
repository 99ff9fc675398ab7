// AdamW (Loshchilov & Hutter 2019), fused: each element's p, g, m, v read once and p, m,
// v written once. Launch: grid-stride, 256 threads. Bytes per element (p, g, m, v read;
// p, m, v written): 28 with fp32 parameters and gradients (a bf16 model's fp32 master
// weights with fp32 gradients), 26 with bf16 gradients, 22 with both bf16; ~15 FLOPs +
// one sqrt + one division. Memory-bound. The bias corrections are computed
// on the host in double (as the CPU backend), so fp32 results match it to rounding.
// As llm.c's adamw_kernel, without its stochastic rounding (bf16 params round to nearest).
#include "backend/cuda/adamw.h"
#include "backend/cuda/common.cuh"

namespace kiln::cuda {

namespace {
template <class T, class G>
__global__ void adamw_kernel(T* param, const G* grad, float* m, float* v, int64_t n, AdamWArgs a) {
  if (a.scale) {  // read on the device: the clipping coefficient needs no host round trip
    const float c = *a.scale;
    if (!isfinite(c)) return;  // a skipped update
    a.grad_scale *= c;
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = to_f(grad[i]) * a.grad_scale;
    const float mi = a.beta1 * m[i] + (1.f - a.beta1) * g;
    const float vi = a.beta2 * v[i] + (1.f - a.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = to_f(param[i]);
    param[i] = from_f<T>(p * a.decay - a.step_size * mi / (sqrtf(vi) / a.bc2_sqrt + a.eps));
  }
}
}  // namespace

void adamw(cudaStream_t s, Elem e, Elem g, void* param, const void* grad, float* m, float* v, int64_t n,
           const AdamWArgs& a) {
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, KILN_DISPATCH_GRAD(g, adamw_kernel<<<grid_for(n, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(param), static_cast<const grad_t*>(grad), m,
                            v, n, a)));
  KILN_CUDA_LAUNCHED("adamw");
}

namespace {
// The weights' moving average: 12 bytes per element with fp32 parameters (10 with bf16).
template <class T>
__global__ void ema_kernel(float* ema, const T* param, int64_t n, float decay, float take) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    ema[i] = decay * ema[i] + take * to_f(param[i]);
}
}  // namespace

void ema_update(cudaStream_t s, Elem e, float* ema, const void* param, int64_t n, float decay,
                float one_minus_decay) {
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, ema_kernel<<<grid_for(n, 256), 256, 0, s>>>(
                            ema, static_cast<const scalar_t*>(param), n, decay, one_minus_decay));
  KILN_CUDA_LAUNCHED("ema_update");
}

}  // namespace kiln::cuda

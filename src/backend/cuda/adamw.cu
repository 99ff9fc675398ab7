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
// One element's update, shared by the per-tensor and the multi-tensor kernels (so that
// the two give the same bits): m and v in place; returns the new parameter value.
__device__ __forceinline__ float adamw_element(float p, float g, float& m, float& v,
                                               float decay, const AdamWArgs& a) {
  m = a.beta1 * m + (1.f - a.beta1) * g;
  v = a.beta2 * v + (1.f - a.beta2) * g * g;
  return p * decay - a.step_size * m / (sqrtf(v) / a.bc2_sqrt + a.eps);
}

template <class T, class G>
__global__ void adamw_kernel(T* param, const G* grad, float* m, float* v, int64_t n, AdamWArgs a) {
  if (a.scale) {  // read on the device: the clipping coefficient needs no host round trip
    const float c = *a.scale;
    if (!isfinite(c)) return;  // a skipped update
    a.grad_scale *= c;
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float mi = m[i], vi = v[i];
    param[i] = from_f<T>(adamw_element(to_f(param[i]), to_f(grad[i]) * a.grad_scale, mi, vi,
                                       a.decay, a));
    m[i] = mi;
    v[i] = vi;
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
// Multi-tensor AdamW: block b works on kChunk elements of segment s, the s with
// block_start[s] <= b < block_start[s + 1]; the segment table travels as a kernel
// parameter (no device copy to keep).
constexpr int kChunk = 4096;
struct MultiArgs {
  AdamWSegment seg[kAdamWMultiMax];
  int64_t block_start[kAdamWMultiMax + 1];
  int count;
  AdamWArgs a;
};

template <class T, class G, bool kMaster>
__global__ void adamw_multi_kernel(const __grid_constant__ MultiArgs args) {
  AdamWArgs a = args.a;
  if (a.scale) {
    const float c = *a.scale;
    if (!isfinite(c)) return;
    a.grad_scale *= c;
  }
  const int64_t b = blockIdx.x;
  int s = 0;
  while (s + 1 < args.count && args.block_start[s + 1] <= b) ++s;
  const AdamWSegment& sg = args.seg[s];
  T* param = static_cast<T*>(sg.param);
  const G* grad = static_cast<const G*>(sg.grad);
  const int64_t begin = (b - args.block_start[s]) * kChunk;
  const int64_t end = begin + kChunk < sg.n ? begin + kChunk : sg.n;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float mi = sg.m[i], vi = sg.v[i];
    const float q = adamw_element(kMaster ? sg.master[i] : to_f(param[i]),
                                  to_f(grad[i]) * a.grad_scale, mi, vi, sg.decay, a);
    sg.m[i] = mi;
    sg.v[i] = vi;
    if (kMaster) sg.master[i] = q;
    param[i] = from_f<T>(q);
  }
}
}  // namespace

void adamw_multi(cudaStream_t s, Elem e, Elem g, bool with_master, const AdamWSegment* segs,
                 int count, const AdamWArgs& a) {
  for (int i = 0; i < count;) {
    MultiArgs args{};
    args.a = a;
    args.count = 0;
    int64_t blocks = 0;
    for (; i < count && args.count < kAdamWMultiMax; ++i) {
      if (segs[i].n <= 0) continue;
      args.block_start[args.count] = blocks;
      args.seg[args.count++] = segs[i];
      blocks += (segs[i].n + kChunk - 1) / kChunk;
    }
    if (args.count == 0) continue;
    args.block_start[args.count] = blocks;
    const dim3 grid(static_cast<unsigned>(blocks));
    KILN_DISPATCH_ELEM(e, KILN_DISPATCH_GRAD(g, {
      if (with_master)
        adamw_multi_kernel<scalar_t, grad_t, true><<<grid, 256, 0, s>>>(args);
      else
        adamw_multi_kernel<scalar_t, grad_t, false><<<grid, 256, 0, s>>>(args);
    }));
    KILN_CUDA_LAUNCHED("adamw_multi");
  }
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

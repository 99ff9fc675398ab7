// Rectified flow (Liu et al. 2023; Esser et al. 2024): interpolated inputs and velocity
// targets, and the per-sample mean squared error.
//
// rectified_flow_inputs: grid-stride element-wise, 256 threads; bytes 16 n (read images
// and noise, write xt and target), 4 FLOPs per element.
// mse_loss: a block of 256 threads per sample (grid-stride over samples); each thread sums
// (pred - target)^2 over a strided range in fp32, writing dpred right after reading its
// element (dpred may alias pred), then a fixed-order block_sum: deterministic. Bytes
// n (size + 4) (+ n size with dpred), 3-5 FLOPs per element.
#include "backend/cuda/common.cuh"
#include "backend/cuda/flow_matching.h"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void flow_inputs_kernel(float* xt, float* target, const float* images,
                                   const float* noise, const float* t, int64_t n, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float tb = t[i / n];
    const float x0 = images[i], x1 = noise[i];
    xt[i] = (1.f - tb) * x0 + tb * x1;
    target[i] = x1 - x0;
  }
}

template <class T>
__global__ void mse_kernel(float* losses, T* dpred, const T* pred, const float* target, int64_t B,
                           int64_t n, float grad_coef) {
  __shared__ float scratch[32];
  for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
    const T* p = pred + b * n;
    const float* q = target + b * n;
    T* dp = dpred ? dpred + b * n : nullptr;
    float acc = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float d = to_f(p[i]) - q[i];
      acc += d * d;
      if (dp) dp[i] = from_f<T>(grad_coef * d);
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) losses[b] = acc / static_cast<float>(n);
  }
}

}  // namespace

void rectified_flow_inputs(cudaStream_t s, float* xt, float* target, const float* images,
                           const float* noise, const float* t, int64_t B, int64_t n) {
  const int64_t total = B * n;
  if (total <= 0) return;
  flow_inputs_kernel<<<grid_for(total, kThreads), kThreads, 0, s>>>(xt, target, images, noise, t,
                                                                     n, total);
  KILN_CUDA_LAUNCHED("rectified_flow_inputs");
}

void mse_loss(cudaStream_t s, Elem e, float* losses, void* dpred, const void* pred,
              const float* target, int64_t B, int64_t n, float grad_coef) {
  if (B <= 0 || n <= 0) return;
  const unsigned grid = static_cast<unsigned>(B < (1 << 20) ? B : (1 << 20));
  KILN_DISPATCH_ELEM(e, mse_kernel<<<grid, kThreads, 0, s>>>(
                            losses, static_cast<scalar_t*>(dpred),
                            static_cast<const scalar_t*>(pred), target, B, n, grad_coef));
  KILN_CUDA_LAUNCHED("mse_loss");
}

}  // namespace kiln::cuda

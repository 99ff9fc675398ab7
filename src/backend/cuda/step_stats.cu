// See step_stats.h. One block of kThreads threads per launch.
#include "backend/cuda/common.cuh"
#include "backend/cuda/step_stats.h"

#include <math_constants.h>

namespace kiln::cuda {

namespace {
constexpr int kThreads = 256;

__global__ void accumulate_loss_kernel(double* acc, const float* losses, const int32_t* targets,
                                       int64_t n) {
  __shared__ double scratch[32];
  double sum = 0.0, count = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (targets[i] == -1) continue;
    sum += losses[i];
    count += 1.0;
  }
  sum = block_sum(sum, scratch);
  count = block_sum(count, scratch);
  if (threadIdx.x == 0) acc[0] += sum, acc[1] += count;
}

__global__ void shard_combine_kernel(float* lse, double* acc, const float* stats,
                                     const int32_t* targets, int64_t N, int64_t tp) {
  __shared__ double scratch[32];
  double sum = 0.0, count = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    double M = -CUDART_INF, S = 0.0, X = 0.0;
    for (int64_t q = 0; q < tp; ++q) M = fmax(M, double(stats[(q * N + i) * 3]));
    for (int64_t q = 0; q < tp; ++q) {
      const float* st = stats + (q * N + i) * 3;
      if (st[1] > 0.f) S += double(st[1]) * exp(double(st[0]) - M);
      X += st[2];
    }
    S = fmax(S, 1.0);
    lse[i] = static_cast<float>(M + log(S));
    if (targets[i] == -1) continue;
    sum += M + log(S) - X;
    count += 1.0;
  }
  sum = block_sum(sum, scratch);
  count = block_sum(count, scratch);
  if (threadIdx.x == 0) acc[0] += sum, acc[1] += count;
}

__global__ void clip_coefficient_kernel(float* coef, const double* sumsq, const double* check,
                                        double max_norm, float loss_scale) {
  const double sq = *sumsq, c = check ? *check : 0.0;
  if (!isfinite(sq) || !isfinite(c)) {
    *coef = CUDART_NAN_F;
    return;
  }
  const double norm = sqrt(sq) / loss_scale;
  const float clip = max_norm <= 0.0 ? 1.f : static_cast<float>(fmin(1.0, max_norm / (norm + 1e-6)));
  *coef = clip / loss_scale;
}
}  // namespace

void accumulate_loss(cudaStream_t s, double* acc, const float* losses, const int32_t* targets,
                     int64_t n) {
  accumulate_loss_kernel<<<1, kThreads, 0, s>>>(acc, losses, targets, n);
  KILN_CUDA_LAUNCHED("accumulate_loss");
}

void cross_entropy_shard_combine(cudaStream_t s, float* lse, double* acc, const float* stats,
                                 const int32_t* targets, int64_t N, int64_t tp) {
  shard_combine_kernel<<<1, kThreads, 0, s>>>(lse, acc, stats, targets, N, tp);
  KILN_CUDA_LAUNCHED("cross_entropy_shard_combine");
}

void clip_coefficient(cudaStream_t s, float* coef, const double* sumsq, const double* check,
                      double max_norm, float loss_scale) {
  clip_coefficient_kernel<<<1, 1, 0, s>>>(coef, sumsq, check, max_norm, loss_scale);
  KILN_CUDA_LAUNCHED("clip_coefficient");
}

}  // namespace kiln::cuda

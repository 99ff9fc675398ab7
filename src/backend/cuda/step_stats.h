// A step's statistics on the device (Backend::accumulate_loss, cross_entropy_shard_combine,
// clip_coefficient), so that the loss and the gradient norm need no host read inside a
// step. Each is one launch of one block (the sizes are a micro-batch's rows at most);
// sums in double in a fixed order (thread-strided partials, then block_sum): bitwise
// reproducible, though not in the CPU backend's sequential order.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// acc[0] += sum of losses[i] with targets[i] != -1, acc[1] += their count (n rows).
void accumulate_loss(cudaStream_t s, double* acc, const float* losses, const int32_t* targets,
                     int64_t n);
/// lse[n] and acc from tp ranks' stats [tp*N, 3] (Backend::cross_entropy_shard_combine).
void cross_entropy_shard_combine(cudaStream_t s, float* lse, double* acc, const float* stats,
                                 const int32_t* targets, int64_t N, int64_t tp);
/// *coef from *sumsq and *check (nullptr: none) (Backend::clip_coefficient).
void clip_coefficient(cudaStream_t s, float* coef, const double* sumsq, const double* check,
                      double max_norm, float loss_scale);

}  // namespace kiln::cuda

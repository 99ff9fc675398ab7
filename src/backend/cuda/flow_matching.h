// Rectified flow inputs and the per-sample MSE loss (Backend::rectified_flow_inputs,
// Backend::mse_loss).
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// xt = (1 - t[b]) images + t[b] noise, target = noise - images over B samples of n fp32
/// elements (each element read before it is written).
void rectified_flow_inputs(cudaStream_t s, float* xt, float* target, const float* images,
                           const float* noise, const float* t, int64_t B, int64_t n);
/// losses[b] = mean over sample b's n elements of (pred - target)^2 (fp32 sums); dpred
/// (nullptr: skipped; may alias pred) = grad_coef (pred - target), grad_coef = 2 grad_scale / n.
void mse_loss(cudaStream_t s, Elem e, float* losses, void* dpred, const void* pred,
              const float* target, int64_t B, int64_t n, float grad_coef);

}  // namespace kiln::cuda

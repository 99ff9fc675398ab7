// RMSNorm over the last dimension (Zhang & Sennrich 2019), forward and backward.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// out [N,C] = inp * rstd * weight, rstd fp32 [N] = 1/sqrt(mean(inp^2) + eps); weight [C]
/// may be null (no scale).
void rmsnorm_forward(cudaStream_t s, Elem e, void* out, float* rstd, const void* inp,
                     const void* weight, int64_t N, int64_t C, float eps);

/// Device scratch bytes rmsnorm_backward needs.
size_t rmsnorm_backward_scratch_bytes(int64_t N, int64_t C);
/// dinp += rstd (w dout - inp rstd^2 mean_c(w dout inp)) (adds, as layernorm_backward);
/// dweight += sum_n dout inp rstd, of element type g (fp32 gradients of bf16 parameters,
/// or e). weight and dweight are both given or both null.
void rmsnorm_backward(cudaStream_t s, Elem e, Elem g, void* dinp, void* dweight,
                      const void* dout, const void* inp, const void* weight, const float* rstd,
                      int64_t N, int64_t C, void* scratch);

}  // namespace kiln::cuda

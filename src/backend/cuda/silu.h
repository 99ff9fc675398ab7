// SiLU (Elfwing et al. 2018), x * sigmoid(x), forward and backward.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

void silu_forward(cudaStream_t s, Elem e, void* out, const void* inp, int64_t n);
/// dinp = dout * silu'(inp); dinp may alias dout.
void silu_backward(cudaStream_t s, Elem e, void* dinp, const void* dout, const void* inp,
                   int64_t n);

}  // namespace kiln::cuda

// GELU, tanh approximation (Hendrycks & Gimpel 2016), forward and backward.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

void gelu_forward(cudaStream_t s, Elem e, void* out, const void* inp, int64_t n);
void gelu_backward(cudaStream_t s, Elem e, void* dinp, const void* dout, const void* inp,
                   int64_t n);

}  // namespace kiln::cuda

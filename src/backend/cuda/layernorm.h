// LayerNorm over the last dimension (Ba, Kiros, Hinton 2016), forward and backward.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// out [N,C] = (inp - mean) * rstd * weight + bias; mean, rstd fp32 [N]. weight and bias
/// [C] may each be null (no scale / no shift).
void layernorm_forward(cudaStream_t s, Elem e, void* out, float* mean, float* rstd,
                       const void* inp, const void* weight, const void* bias, int64_t N,
                       int64_t C, float eps);

/// Device scratch bytes layernorm_backward needs.
size_t layernorm_backward_scratch_bytes(int64_t N, int64_t C);
/// dinp += d/dinp (the residual stream's gradient already holds the skip part);
/// dweight += sum_n dout * norm; dbias += sum_n dout. dweight and dbias are of element
/// type g (fp32 gradients of bf16 parameters, or e). weight may be null (then dweight
/// is); dweight and dbias may each be null (not computed).
void layernorm_backward(cudaStream_t s, Elem e, Elem g, void* dinp, void* dweight, void* dbias,
                        const void* dout, const void* inp, const void* weight, const float* mean,
                        const float* rstd, int64_t N, int64_t C, void* scratch);

}  // namespace kiln::cuda

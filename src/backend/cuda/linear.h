// The linear layer's own kernels beside the cuBLASLt GEMMs (gemm.h): the bias gradient
// (a deterministic column sum) and a bias add for when no fused epilogue is available.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// Device scratch bytes bias_backward needs.
size_t bias_backward_scratch_bytes(int64_t N, int64_t OC);
/// dbias[OC] (element type g) += sum over N rows of dout[N,OC] (element type e).
void bias_backward(cudaStream_t s, Elem e, Elem g, void* dbias, const void* dout, int64_t N,
                   int64_t OC, void* scratch);
/// out[N,OC] += bias[OC] (row broadcast).
void add_bias(cudaStream_t s, Elem e, void* out, const void* bias, int64_t N, int64_t OC);

}  // namespace kiln::cuda

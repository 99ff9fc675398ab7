// SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"), forward and backward.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// inp [N,2H] = [gate | up] per row; out [N,H] = silu(gate) * up.
void swiglu_forward(cudaStream_t s, Elem e, void* out, const void* inp, int64_t N, int64_t H);
/// dinp [N,2H] (overwritten): dgate = dout up sg (1 + gate (1 - sg)), dup = dout gate sg,
/// sg = sigmoid(gate).
void swiglu_backward(cudaStream_t s, Elem e, void* dinp, const void* dout, const void* inp,
                     int64_t N, int64_t H);

}  // namespace kiln::cuda

// out = a + b, element-wise (the residual connection); out may alias a or b. And
// add_columns: a scaled src added into a column range of out (a LoRA adapter's output).
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

void add(cudaStream_t s, Elem e, void* out, const void* a, const void* b, int64_t n);
/// out[n * out_width + out_col + j] = fma(alpha, src[n * src_width + j], that element) in
/// fp32, rounded once, for n < rows and j < src_width (Backend::add_columns); src must not
/// overlap out.
void add_columns(cudaStream_t s, Elem e, void* out, int64_t out_width, int64_t out_col,
                 const void* src, int64_t src_width, int64_t rows, float alpha);

}  // namespace kiln::cuda

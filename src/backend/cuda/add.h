// out = a + b, element-wise (the residual connection); out may alias a or b.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

void add(cudaStream_t s, Elem e, void* out, const void* a, const void* b, int64_t n);

}  // namespace kiln::cuda

// Memory kernels: fill with a bit pattern (every dtype), and the sum of squares in
// double (gradient norms).
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// p[i] = bits for i < n, 32-bit or 16-bit elements.
void fill_u32(cudaStream_t s, void* p, uint32_t bits, int64_t n);
void fill_u16(cudaStream_t s, void* p, uint16_t bits, int64_t n);

/// Bytes of device scratch sum_squares needs for n elements.
size_t sum_squares_scratch_bytes(int64_t n);
/// *result (device double) = sum of x[i]^2 in double. Two passes: per-block partials,
/// then one block sums them in block order, so the result does not depend on timing.
void sum_squares(cudaStream_t s, Elem e, const void* x, int64_t n, void* scratch, double* result);

}  // namespace kiln::cuda

// Memory kernels: fill with a bit pattern (every dtype), conversion between float
// dtypes (copy, and copy_columns on a column range of each row), and the sum of squares
// in double (gradient norms).
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// p[i] = bits for i < n, 32-bit or 16-bit elements.
void fill_u32(cudaStream_t s, void* p, uint32_t bits, int64_t n);
void fill_u16(cudaStream_t s, void* p, uint16_t bits, int64_t n);
void fill_u64(cudaStream_t s, void* p, uint64_t bits, int64_t n);

/// Storage formats convert() reads and writes: fp32, bf16, fp16 and the OCP fp8 formats
/// E4M3 and E5M2 (core/dtype.h).
enum class FloatKind { F32, BF16, F16, E4M3, E5M2 };
/// Bytes per element of a kind.
constexpr int float_kind_size(FloatKind k) {
  return k == FloatKind::F32 ? 4 : k == FloatKind::E4M3 || k == FloatKind::E5M2 ? 1 : 2;
}
/// dst[i] = src[i] converted between two different kinds, through fp32 (every kind's
/// values are exact in it): round to nearest, ties to even; NaN stays NaN, Inf stays Inf,
/// except into fp8, which saturates (finite values beyond the largest and +-Inf become
/// +-largest; E4M3 has no Inf) and writes core's NaN codes. As core/dtype.h's convert():
/// bit for bit, NaN payloads into fp32/bf16/fp16 aside.
void convert(cudaStream_t s, void* dst, FloatKind dst_kind, const void* src, FloatKind src_kind,
             int64_t n);

/// dst[n * dst_width + dst_col + j] = src[n * src_width + src_col + j] for n < rows and
/// j < ncols (Backend::copy_columns), converted as convert() when the kinds differ, copied
/// bit for bit when they are the same.
void convert_columns(cudaStream_t s, void* dst, FloatKind dst_kind, int64_t dst_width,
                     int64_t dst_col, const void* src, FloatKind src_kind, int64_t src_width,
                     int64_t src_col, int64_t rows, int64_t ncols);

/// dst (bf16) = src (fp32) rounded stochastically with Philox(seed, stream) word g of
/// element i, g = begin + (i / row_len) * stride + i % row_len (begin + i when row_len is
/// 0: GlobalIndices), as the CPU backend does (Backend::copy_stochastic_round): bitwise
/// the same result.
void stochastic_round_bf16(cudaStream_t s, void* dst, const float* src, int64_t n, uint64_t seed,
                           uint64_t stream, int64_t begin, int64_t row_len, int64_t stride);

/// Bytes of device scratch sum_squares needs for n elements.
size_t sum_squares_scratch_bytes(int64_t n);
/// *result (device double) += sum of x[i]^2 in double. Two passes: per-block partials,
/// then one block sums them in block order, so the result does not depend on timing.
void sum_squares(cudaStream_t s, Elem e, const void* x, int64_t n, void* scratch, double* result);

}  // namespace kiln::cuda

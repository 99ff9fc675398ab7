// Element types and the conversions between them.
//
// fp32 <-> bf16 and fp32 <-> fp16 conversions round to nearest, ties to even, and keep
// NaN (as a quiet NaN of the same sign) and +-Inf. Overflow to fp16 gives +-Inf, as IEEE
// 754 round-to-nearest requires; values below fp16's range become subnormals or zero.
// Reference: IEEE 754-2019 section 4.3.1; bf16 as in Google's brain float (the upper 16
// bits of an fp32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kiln {

/// F64 holds the step's device-side statistics (loss and gradient-norm sums, kept in
/// double as their host sums were); no layer computes in it.
enum class DType : uint8_t { F32, BF16, F16, I32, F64 };

/// Bytes per element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::F64: return 8;
  }
  return 0;
}

/// "fp32", "bf16", "fp16", "int32", "fp64".
std::string_view dtype_name(DType t);
/// Parses "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16", "int32". Throws kiln::Error.
DType parse_dtype(std::string_view name);

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

/// fp32 -> bf16 bits, round to nearest even; NaN stays NaN (quieted), Inf stays Inf.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

/// fp32 -> fp16 bits, round to nearest even, with subnormals; NaN and Inf preserved.
uint16_t f32_to_f16(float f);
/// fp16 bits -> fp32 (exact).
float f16_to_f32(uint16_t h);

/// Converts n elements between any two floating dtypes (host memory).
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace kiln

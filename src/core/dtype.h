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
/// double as their host sums were); no layer computes in it. E4M3 and E5M2 are the OCP
/// 8-bit floating-point formats (below): storage and conversion only; train.fp8 computes
/// on their values held in bf16 or fp32 (docs/fp8.md).
enum class DType : uint8_t { F32, BF16, F16, I32, F64, E4M3, E5M2 };

/// Bytes per element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::F64: return 8;
    case DType::E4M3: return 1;
    case DType::E5M2: return 1;
  }
  return 0;
}

/// Whether `t` is one of the 8-bit float formats.
constexpr bool is_fp8(DType t) { return t == DType::E4M3 || t == DType::E5M2; }

/// "fp32", "bf16", "fp16", "int32", "fp64", "fp8_e4m3", "fp8_e5m2".
std::string_view dtype_name(DType t);
/// Parses "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16", "int32", "fp64"/"float64",
/// "fp8_e4m3"/"float8_e4m3fn", "fp8_e5m2"/"float8_e5m2". Throws kiln::Error.
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

// The OCP 8-bit floating-point formats (OCP "OFP8 Formats for Deep Learning", v1.0, 2023;
// Micikevicius et al. 2022, "FP8 Formats for Deep Learning"), PyTorch's float8_e4m3fn and
// float8_e5m2:
//   E4M3  sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; NaN = S.1111.111;
//         largest finite 448 (S.1111.110), smallest subnormal 2^-9.
//   E5M2  sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: +-Inf = S.11111.00,
//         NaN = S.11111.{01,10,11}; largest finite 57344 (S.11110.11), smallest subnormal 2^-16.
// fp32 -> fp8 rounds to nearest, ties to even, and saturates (the spec's saturating mode,
// as torchao and Transformer Engine cast for training): finite values beyond the largest
// and +-Inf become +-largest; NaN becomes the NaN code 0x7f (E4M3) / 0x7e (E5M2) with its
// sign. fp8 -> fp32 is exact.
inline constexpr float kE4M3Max = 448.f;
inline constexpr float kE5M2Max = 57344.f;
/// The largest finite value of an fp8 dtype.
constexpr float fp8_max(DType t) { return t == DType::E4M3 ? kE4M3Max : kE5M2Max; }
uint8_t f32_to_e4m3(float f);
uint8_t f32_to_e5m2(float f);
float e4m3_to_f32(uint8_t code);
float e5m2_to_f32(uint8_t code);

/// The nearest fp8 value of f as an fp32, saturating: e4m3_to_f32(f32_to_e4m3(f)) (or
/// E5M2) for every f, NaN kept, computed without the codes: normal results by rounding
/// the fp32 mantissa to 3 (2) bits, subnormal ones by adding and subtracting 2^(23 + e)
/// (e the subnormal step's exponent), so that a loop over it vectorises (cpu/fp8.cpp).
inline float fp8_round(float f, DType t) {
  const bool e4m3 = t == DType::E4M3;
  const float max = e4m3 ? kE4M3Max : kE5M2Max;
  const float min_normal = e4m3 ? 0x1p-6f : 0x1p-14f;
  const float sub_magic = e4m3 ? 0x1p14f : 0x1p7f;  // 2^23 x the subnormal step 2^-9, 2^-16
  const uint32_t drop = e4m3 ? 20 : 21;              // fp32 mantissa bits beyond the format's
  const float a = f < 0.f ? -f : f;
  const uint32_t u = f32_bits(a);
  const uint32_t normal = (u + (1u << (drop - 1)) - 1u + ((u >> drop) & 1u)) & ~((1u << drop) - 1u);
  float r = a >= min_normal ? bits_f32(normal) : (a + sub_magic) - sub_magic;
  r = r > max ? max : r;  // saturation; +Inf included
  return a != a ? f : (f32_bits(f) >> 31 ? -r : r);
}

/// train.fp8's tensorwise scale (docs/fp8.md): the power of two S = 2^floor(log2(fmax /
/// amax)) that puts the tensor's largest magnitude `amax` at most at fmax = fp8_max(t), so
/// a value x is stored as the fp8 code of x S and means code / S. A power of two (as
/// torchao's round_scales_to_power_of_2 and MX's E8M0 scales) keeps code / S exact in
/// fp32 and bf16, so the CPU emulates the fp8 GEMMs exactly. amax = 0 gives S = 1; the
/// exponent is clamped to [-126, 127]. Only for finite amax >= 0.
float fp8_scale(float amax, DType t);

/// Converts n elements between any two floating dtypes (host memory).
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace kiln

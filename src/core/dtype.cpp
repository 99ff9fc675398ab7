#include "core/dtype.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace kiln {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::I32: return "int32";
    case DType::F64: return "fp64";
    case DType::E4M3: return "fp8_e4m3";
    case DType::E5M2: return "fp8_e5m2";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "fp16" || name == "float16") return DType::F16;
  if (name == "int32") return DType::I32;
  if (name == "fp64" || name == "float64") return DType::F64;
  if (name == "fp8_e4m3" || name == "float8_e4m3fn") return DType::E4M3;
  if (name == "fp8_e5m2" || name == "float8_e5m2") return DType::E5M2;
  KILN_FAIL("unknown dtype '{}' (expected fp32, bf16, fp16, int32, fp64, fp8_e4m3 or fp8_e5m2)",
            name);
}

namespace {

// An OFP8 format by its field widths: M mantissa bits, exponent bias, and the NaN code it
// produces (sign cleared).
struct Fp8Format {
  int mantissa_bits, bias;
  uint8_t nan_code;
};
constexpr Fp8Format kE4M3{3, 7, 0x7f};
constexpr Fp8Format kE5M2{2, 15, 0x7e};

// The code of f: fp8_round gives the nearest fp8 value (the one rounding, saturating),
// which this encodes exactly.
uint8_t f32_to_fp8(float f, const Fp8Format& fmt, DType t) {
  const uint32_t u = f32_bits(fp8_round(f, t));
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | fmt.nan_code;
  const int M = fmt.mantissa_bits;
  const int min_normal_exp = 1 - fmt.bias;  // unbiased exponent of the smallest normal
  if (static_cast<int>(a >> 23) - 127 < min_normal_exp)  // subnormal or zero: m 2^(min - M)
    return sign | static_cast<uint8_t>(std::ldexp(bits_f32(a), M - min_normal_exp));
  // Normal: the value's low mantissa bits are zero; rebias the exponent (127 -> bias).
  return sign | static_cast<uint8_t>((a >> (23 - M)) - (static_cast<uint32_t>(127 - fmt.bias) << M));
}

float fp8_to_f32(uint8_t code, const Fp8Format& fmt, bool has_inf) {
  const int M = fmt.mantissa_bits;
  const int exp_field = (code & 0x7f) >> M, mant = code & ((1 << M) - 1);
  const int exp_max = 0x7f >> M;
  float v;
  if (exp_field == exp_max && (has_inf || mant == (1 << M) - 1)) {
    v = has_inf && mant == 0 ? INFINITY : NAN;
  } else if (exp_field == 0) {
    v = std::ldexp(static_cast<float>(mant), 1 - fmt.bias - M);
  } else {
    v = std::ldexp(static_cast<float>(mant + (1 << M)), exp_field - fmt.bias - M);
  }
  return code & 0x80 ? -v : v;
}

}  // namespace

uint8_t f32_to_e4m3(float f) { return f32_to_fp8(f, kE4M3, DType::E4M3); }
uint8_t f32_to_e5m2(float f) { return f32_to_fp8(f, kE5M2, DType::E5M2); }
float e4m3_to_f32(uint8_t code) { return fp8_to_f32(code, kE4M3, false); }
float e5m2_to_f32(uint8_t code) { return fp8_to_f32(code, kE5M2, true); }

float fp8_scale(float amax, DType t) {
  if (!(amax > 0.f)) return 1.f;
  // ilogb is floor(log2) exactly; the quotient in double rounds only past fp32's bits.
  const int e = std::ilogb(static_cast<double>(fp8_max(t)) / amax);
  return std::ldexp(1.f, std::clamp(e, -126, 127));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (a < 0x38800000u) {
    // Result is an fp16 subnormal (or zero): value = m * 2^-24 with m in [0, 1024).
    if (a < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): zero
    const uint32_t exp = a >> 23;
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // bits to drop: (exp-127) + 24 - 23 = exp - 126 -> right shift
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias exponent (127 -> 15) and round 23 -> 10 mantissa bits.
  uint32_t v = a - (112u << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

namespace {
float load(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::I32: return static_cast<float>(static_cast<const int32_t*>(p)[i]);
    case DType::F64: return static_cast<float>(static_cast<const double*>(p)[i]);
    case DType::E4M3: return e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::E5M2: return e5m2_to_f32(static_cast<const uint8_t*>(p)[i]);
  }
  return 0.f;
}
void store(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    case DType::E4M3: static_cast<uint8_t*>(p)[i] = f32_to_e4m3(v); break;
    case DType::E5M2: static_cast<uint8_t*>(p)[i] = f32_to_e5m2(v); break;
  }
}
}  // namespace

void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * dtype_size(src_type));
    return;
  }
  for (size_t i = 0; i < n; ++i) store(dst, dst_type, i, load(src, src_type, i));
}

}  // namespace kiln

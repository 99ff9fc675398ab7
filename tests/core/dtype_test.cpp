// fp32 <-> bf16 / fp16 conversions against an independent double-precision reference.
//
// The reference rounds in double with std::nearbyint (round half to even in the default
// rounding mode) on the value scaled by the target's unit in the last place, then encodes
// the rounded value field by field. It shares no code with src/core/dtype.*.
#include "core/dtype.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace kiln {
namespace {

bool is_nan16(uint16_t h, int exp_bits) {
  const int mant_bits = 15 - exp_bits;
  const uint16_t exp_mask = static_cast<uint16_t>(((1u << exp_bits) - 1u) << mant_bits);
  const uint16_t mant_mask = static_cast<uint16_t>((1u << mant_bits) - 1u);
  return (h & exp_mask) == exp_mask && (h & mant_mask) != 0;
}

// Decodes a 16-bit float with `exp_bits` exponent bits (bf16: 8, fp16: 5) into a double.
double decode16(uint16_t h, int exp_bits) {
  const int mant_bits = 15 - exp_bits;
  const int bias = (1 << (exp_bits - 1)) - 1;
  const bool neg = (h & 0x8000u) != 0;
  const int e = (h >> mant_bits) & ((1 << exp_bits) - 1);
  const int m = h & ((1 << mant_bits) - 1);
  double v;
  if (e == (1 << exp_bits) - 1) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - mant_bits);
  } else {
    v = std::ldexp(static_cast<double>(m + (1 << mant_bits)), e - bias - mant_bits);
  }
  return neg ? -v : v;
}

// Reference fp32 -> 16-bit conversion for a non-NaN input: round to nearest even in
// double, then encode. max_exp is the largest unbiased exponent of a finite value.
uint16_t encode16_ref(float f, int exp_bits) {
  const int mant_bits = 15 - exp_bits;
  const int bias = (1 << (exp_bits - 1)) - 1;
  const uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
  const double a = std::fabs(static_cast<double>(f));
  const uint16_t inf = static_cast<uint16_t>(sign | (((1u << exp_bits) - 1u) << mant_bits));
  if (std::isinf(a)) return inf;
  if (a == 0.0) return sign;
  const int min_exp = 1 - bias;  // smallest normal exponent
  int e = std::ilogb(a);         // a in [2^e, 2^(e+1))
  if (e < min_exp) e = min_exp;  // subnormal range has the ulp of the smallest binade
  const double ulp = std::ldexp(1.0, e - mant_bits);
  const double q = std::nearbyint(a / ulp);  // exact scaling; ties to even
  const double r = q * ulp;
  const double overflow = std::ldexp(1.0, bias + 1);  // 2^(max_exp + 1)
  if (r >= overflow) return inf;
  // Encode r exactly.
  if (r < std::ldexp(1.0, min_exp)) {
    const double m = r / std::ldexp(1.0, min_exp - mant_bits);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(m));
  }
  const int re = std::ilogb(r);
  const double m = r / std::ldexp(1.0, re - mant_bits) - static_cast<double>(1 << mant_bits);
  return static_cast<uint16_t>(sign | ((re + bias) << mant_bits) | static_cast<uint16_t>(m));
}

uint16_t bf16_ref(float f) { return encode16_ref(f, 8); }
uint16_t f16_ref(float f) { return encode16_ref(f, 5); }

std::string hex(uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", x);
  return buf;
}

// Checks one fp32 value against the reference for both formats (NaNs handled apart).
::testing::AssertionResult check_value(float f) {
  const uint32_t u = f32_bits(f);
  if (std::isnan(f)) {
    const uint16_t b = f32_to_bf16(f), h = f32_to_f16(f);
    if (!is_nan16(b, 8) || ((b & 0x8000u) != 0) != std::signbit(f) || !(b & 0x0040u))
      return ::testing::AssertionFailure() << "bf16 of NaN " << hex(u) << " = " << hex(b);
    if (!is_nan16(h, 5) || ((h & 0x8000u) != 0) != std::signbit(f) || !(h & 0x0200u))
      return ::testing::AssertionFailure() << "fp16 of NaN " << hex(u) << " = " << hex(h);
    return ::testing::AssertionSuccess();
  }
  const uint16_t b = f32_to_bf16(f), bref = bf16_ref(f);
  if (b != bref)
    return ::testing::AssertionFailure() << "bf16(" << f << " = " << hex(u) << ") = " << hex(b)
                                         << ", expected " << hex(bref);
  const uint16_t h = f32_to_f16(f), href = f16_ref(f);
  if (h != href)
    return ::testing::AssertionFailure() << "fp16(" << f << " = " << hex(u) << ") = " << hex(h)
                                         << ", expected " << hex(href);
  return ::testing::AssertionSuccess();
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::I32), 4u);
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32})
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_dtype("float32"), DType::F32);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(parse_dtype("float16"), DType::F16);
  EXPECT_THROW(parse_dtype("fp8"), Error);  // which of the two formats?
  EXPECT_THROW(parse_dtype(""), Error);
}

TEST(DType, ReferenceSelfCheck) {
  // A few hand-computed values so that the reference itself is pinned.
  EXPECT_EQ(f16_ref(1.0f), 0x3c00);
  EXPECT_EQ(f16_ref(-2.0f), 0xc000);
  EXPECT_EQ(f16_ref(65504.0f), 0x7bff);
  EXPECT_EQ(f16_ref(65520.0f), 0x7c00);       // tie between 65504 and 65536: to even = Inf
  EXPECT_EQ(f16_ref(65519.996f), 0x7bff);
  EXPECT_EQ(f16_ref(0x1p-24f), 0x0001);       // smallest subnormal
  EXPECT_EQ(f16_ref(0x1p-25f), 0x0000);       // tie with 0: to even
  EXPECT_EQ(f16_ref(0x1.8p-24f), 0x0002);     // 1.5 ulp: tie to even (2)
  EXPECT_EQ(f16_ref(0x1p-14f), 0x0400);       // smallest normal
  EXPECT_EQ(f16_ref(1.0f + 0x1p-11f), 0x3c00);  // tie to even (down)
  EXPECT_EQ(f16_ref(1.0f + 0x3p-11f), 0x3c02);  // tie to even (up)
  EXPECT_EQ(bf16_ref(1.0f), 0x3f80);
  EXPECT_EQ(bf16_ref(bits_f32(0x3f808000u)), 0x3f80);  // tie to even (down)
  EXPECT_EQ(bf16_ref(bits_f32(0x3f818000u)), 0x3f82);  // tie to even (up)
  EXPECT_EQ(bf16_ref(bits_f32(0x7f7fffffu)), 0x7f80);  // FLT_MAX rounds to Inf
  EXPECT_EQ(bf16_ref(bits_f32(0x00000001u)), 0x0000);  // smallest fp32 subnormal
  EXPECT_EQ(bf16_ref(bits_f32(0x00008000u)), 0x0000);  // tie with 0
  EXPECT_EQ(bf16_ref(bits_f32(0x00018000u)), 0x0002);  // tie to even (up)
}

TEST(DType, EdgeCases) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_bf16(inf), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-inf), 0xff80);
  EXPECT_EQ(f32_to_f16(inf), 0x7c00);
  EXPECT_EQ(f32_to_f16(-inf), 0xfc00);
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  // fp16 overflow.
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  // fp16 subnormals.
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(-0x1p-24f), 0x8001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);
  EXPECT_EQ(f32_to_f16(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-26f), 0x0000);
  EXPECT_EQ(f32_to_f16(0x3ffp-24f), 0x03ff);  // largest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);
  EXPECT_EQ(f32_to_f16(0x3ff.8p-24f), 0x0400);  // tie between largest subnormal and min normal
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  // NaN stays NaN, sign kept, quiet bit set; payload-free signalling NaNs too.
  for (uint32_t nan_bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u,
                            0x7fffffffu, 0xffffffffu, 0x7f802000u}) {
    EXPECT_TRUE(check_value(bits_f32(nan_bits)));
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits_f32(nan_bits)))));
    EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(bits_f32(nan_bits)))));
  }
}

// Every 16-bit pattern decodes exactly and survives 16 -> 32 -> 16 (NaNs come back
// quieted, with their sign and payload otherwise kept).
TEST(DType, Exhaustive16BitRoundTrip) {
  int failures = 0;
  for (uint32_t i = 0; i < 65536 && failures < 10; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    // bf16
    {
      const float f = bf16_to_f32(h);
      const double want = decode16(h, 8);
      const uint16_t back = f32_to_bf16(f);
      if (is_nan16(h, 8)) {
        if (!std::isnan(f) || back != (h | 0x0040u)) {
          ADD_FAILURE() << "bf16 NaN " << hex(h) << " -> " << hex(f32_bits(f)) << " -> " << hex(back);
          ++failures;
        }
      } else if (static_cast<double>(f) != want || std::signbit(f) != bool(h & 0x8000u) ||
                 back != h) {
        ADD_FAILURE() << "bf16 " << hex(h) << " -> " << f << " (want " << want << ") -> " << hex(back);
        ++failures;
      }
    }
    // fp16
    {
      const float f = f16_to_f32(h);
      const double want = decode16(h, 5);
      const uint16_t back = f32_to_f16(f);
      if (is_nan16(h, 5)) {
        if (!std::isnan(f) || bool(f32_bits(f) >> 31) != bool(h & 0x8000u) ||
            back != (h | 0x0200u)) {
          ADD_FAILURE() << "fp16 NaN " << hex(h) << " -> " << hex(f32_bits(f)) << " -> " << hex(back);
          ++failures;
        }
      } else if (static_cast<double>(f) != want || std::signbit(f) != bool(h & 0x8000u) ||
                 back != h) {
        ADD_FAILURE() << "fp16 " << hex(h) << " -> " << f << " (want " << want << ") -> " << hex(back);
        ++failures;
      }
    }
  }
}

// Every tie (midpoint between two adjacent 16-bit values) and its fp32 neighbours.
TEST(DType, ExhaustiveTies) {
  int failures = 0;
  for (int exp_bits : {8, 5}) {
    for (uint32_t i = 0; i < 0x7fff && failures < 10; ++i) {
      const uint16_t lo = static_cast<uint16_t>(i);
      const uint16_t hi = static_cast<uint16_t>(i + 1);
      if (is_nan16(lo, exp_bits) || is_nan16(hi, exp_bits)) continue;
      const double a = decode16(lo, exp_bits), b = decode16(hi, exp_bits);
      if (std::isinf(a)) continue;
      // For the top finite value, the "next" value is 2^(max_exp+1) (an Inf in the
      // format), whose midpoint still rounds to Inf.
      const double mid = (a + (std::isinf(b) ? 2 * a - decode16(lo - 1, exp_bits) : b)) / 2;
      const float fm = static_cast<float>(mid);
      if (static_cast<double>(fm) != mid) continue;  // bf16 ties below fp32's precision
      for (float f : {fm, std::nextafter(fm, 0.f), std::nextafter(fm, 1e30f)}) {
        for (float g : {f, -f}) {
          auto r = check_value(g);
          if (!r) {
            ADD_FAILURE() << r.message();
            ++failures;
          }
        }
      }
    }
  }
}

// Random fp32 values: uniform bit patterns (all exponents, NaNs and Infs included), and
// values concentrated in and around fp16's range.
TEST(DType, RandomAgainstReference) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int failures = 0;
  for (int i = 0; i < 2'000'000 && failures < 10; ++i) {
    uint32_t u = static_cast<uint32_t>(rng());
    if (i & 1) {
      // exponent in [127-30, 127+17): fp16 subnormals, normals and overflow.
      const uint32_t e = 97 + static_cast<uint32_t>(rng() % 47);
      u = (u & 0x807fffffu) | (e << 23);
    }
    auto r = check_value(bits_f32(u));
    if (!r) {
      ADD_FAILURE() << r.message();
      ++failures;
    }
  }
}

TEST(DType, ConvertArrays) {
  std::vector<float> src = {0.f, -0.f, 1.f, -1.5f, 3.14159f, 65504.f, 70000.f, 1e-6f, 0x1p-24f,
                            std::numeric_limits<float>::infinity(), 1.0f + 0x1p-11f};
  const size_t n = src.size();
  std::vector<uint16_t> b(n), h(n);
  convert(src.data(), DType::F32, b.data(), DType::BF16, n);
  convert(src.data(), DType::F32, h.data(), DType::F16, n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(b[i], bf16_ref(src[i])) << i;
    EXPECT_EQ(h[i], f16_ref(src[i])) << i;
  }
  std::vector<float> back(n);
  convert(b.data(), DType::BF16, back.data(), DType::F32, n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(back[i], bf16_to_f32(b[i])) << i;
  convert(h.data(), DType::F16, back.data(), DType::F32, n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(back[i], f16_to_f32(h[i])) << i;
  // bf16 -> fp16 goes through fp32.
  std::vector<uint16_t> bh(n);
  convert(b.data(), DType::BF16, bh.data(), DType::F16, n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(bh[i], f32_to_f16(bf16_to_f32(b[i]))) << i;
  // Same type: a plain copy.
  std::vector<float> same(n);
  convert(src.data(), DType::F32, same.data(), DType::F32, n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(f32_bits(same[i]), f32_bits(src[i])) << i;
}

}  // namespace
}  // namespace kiln

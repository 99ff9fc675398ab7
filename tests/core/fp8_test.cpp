// The OCP 8-bit float formats of core/dtype.h against a reference written from the OCP
// "OFP8 Formats for Deep Learning" specification (v1.0, 2023), section 5: every one of
// the 256 codes of each format decoded by the spec's formula in double, and fp32 inputs
// encoded by searching all finite codes for the nearest value (ties to the even code,
// saturation past the largest finite value) instead of by bit manipulation.
#include "core/dtype.h"
#include "core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace kiln {
namespace {

struct Spec {
  DType dtype;
  int exp_bits, mant_bits, bias;
  bool ieee_specials;  // E5M2: Inf and NaN at the all-ones exponent; E4M3: NaN = S.1111.111
  double max_finite;
};
const Spec kE4M3{DType::E4M3, 4, 3, 7, false, 448.0};
const Spec kE5M2{DType::E5M2, 5, 2, 15, true, 57344.0};

bool spec_is_nan(const Spec& f, int code) {
  const int e = (code >> f.mant_bits) & ((1 << f.exp_bits) - 1), m = code & ((1 << f.mant_bits) - 1);
  const int e_all = (1 << f.exp_bits) - 1, m_all = (1 << f.mant_bits) - 1;
  return f.ieee_specials ? e == e_all && m != 0 : e == e_all && m == m_all;
}
bool spec_is_inf(const Spec& f, int code) {
  const int e = (code >> f.mant_bits) & ((1 << f.exp_bits) - 1), m = code & ((1 << f.mant_bits) - 1);
  return f.ieee_specials && e == (1 << f.exp_bits) - 1 && m == 0;
}
// (-1)^S 2^(1-bias) (0 + M/2^m) for E = 0, (-1)^S 2^(E-bias) (1 + M/2^m) otherwise.
double spec_value(const Spec& f, int code) {
  if (spec_is_nan(f, code)) return std::numeric_limits<double>::quiet_NaN();
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  if (spec_is_inf(f, code)) return sign * std::numeric_limits<double>::infinity();
  const int e = (code >> f.mant_bits) & ((1 << f.exp_bits) - 1), m = code & ((1 << f.mant_bits) - 1);
  const double frac = static_cast<double>(m) / static_cast<double>(1 << f.mant_bits);
  return e == 0 ? sign * std::pow(2.0, 1 - f.bias) * frac
                : sign * std::pow(2.0, e - f.bias) * (1.0 + frac);
}

// The code a saturating round-to-nearest-even conversion gives: the nearest finite value,
// ties to the code with an even mantissa; beyond the largest finite value (and +-Inf) the
// largest of that sign; NaN: any NaN code (checked by value).
int spec_encode(const Spec& f, float x) {
  const double v = x;
  const int sign = std::signbit(x) ? 0x80 : 0;
  if (std::isinf(v) || std::fabs(v) >= f.max_finite) {
    for (int c = 0; c < 128; ++c)
      if (spec_value(f, c) == f.max_finite) return sign | c;
  }
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 128; ++c) {  // magnitudes only; the sign is copied
    if (spec_is_nan(f, c) || spec_is_inf(f, c)) continue;
    const double err = std::fabs(std::fabs(v) - spec_value(f, c));
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return sign | best;
}

uint8_t encode(const Spec& f, float x) { return f.dtype == DType::E4M3 ? f32_to_e4m3(x) : f32_to_e5m2(x); }
float decode(const Spec& f, uint8_t c) { return f.dtype == DType::E4M3 ? e4m3_to_f32(c) : e5m2_to_f32(c); }

class Fp8Format : public ::testing::TestWithParam<Spec> {};

TEST_P(Fp8Format, EveryCodeDecodesAsTheSpecSays) {
  const Spec& f = GetParam();
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const double want = spec_value(f, c);
    const float got = decode(f, static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      ++nans;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;  // -0 included
    // Every finite value converts back to its own code (the round trip); Inf saturates.
    if (std::isinf(want)) {
      EXPECT_EQ(decode(f, encode(f, got)), std::copysign(fp8_max(f.dtype), got));
      continue;
    }
    EXPECT_EQ(encode(f, got), c) << "code " << c;
  }
  EXPECT_EQ(nans, f.ieee_specials ? 6 : 2);
  EXPECT_EQ(decode(f, 0x01), f.ieee_specials ? 0x1p-16f : 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(static_cast<double>(fp8_max(f.dtype)), f.max_finite);
}

TEST_P(Fp8Format, BoundariesAndSpecials) {
  const Spec& f = GetParam();
  const float max = fp8_max(f.dtype);
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {max, std::nextafter(max, inf), 2 * max, 1e30f, inf, -inf, -max * 1.5f})
    EXPECT_EQ(decode(f, encode(f, x)), std::copysign(max, x)) << x;  // saturation
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(decode(f, encode(f, nan))));
  EXPECT_TRUE(std::isnan(decode(f, encode(f, -nan))));
  // Half the smallest subnormal is a tie with zero: to even (zero); above it rounds up.
  const float tiny = decode(f, 0x01);
  EXPECT_EQ(encode(f, tiny / 2), 0x00);
  EXPECT_EQ(encode(f, -tiny / 2), 0x80);
  EXPECT_EQ(encode(f, std::nextafter(tiny / 2, 1.f)), 0x01);
  EXPECT_EQ(encode(f, 1.5f * tiny), 0x02);  // tie between codes 1 and 2: even
  EXPECT_EQ(encode(f, 2.5f * tiny), 0x02);
  EXPECT_EQ(encode(f, 1e-30f), 0x00);
  EXPECT_EQ(encode(f, 0x1p-140f), 0x00);  // an fp32 subnormal
}

TEST_P(Fp8Format, RandomInputsMatchTheNearestCode) {
  const Spec& f = GetParam();
  std::mt19937 gen(0x5eed ^ static_cast<unsigned>(f.dtype));
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<float> logmag(-22.f, 18.f);
  int checked = 0;
  for (int i = 0; i < 20000; ++i) {
    // Half random bit patterns (every fp32 class), half magnitudes around fp8's range.
    const float x = i % 2 ? bits_f32(bits(gen))
                          : (bits(gen) & 1 ? -1.f : 1.f) * std::exp2(logmag(gen));
    const uint8_t got = encode(f, x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(decode(f, got)));
      continue;
    }
    ASSERT_EQ(got, spec_encode(f, x)) << "x = " << x << " (bits " << std::hex << f32_bits(x) << ")";
    ++checked;
  }
  EXPECT_GT(checked, 19000);
  // Midpoints between neighbouring codes (ties) and one fp32 ulp either side.
  for (int c = 0; c < 127; ++c) {
    if (spec_is_nan(f, c + 1) || spec_is_inf(f, c + 1)) break;
    const float mid = static_cast<float>((spec_value(f, c) + spec_value(f, c + 1)) / 2);
    for (float x : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e9f), -mid})
      ASSERT_EQ(encode(f, x), spec_encode(f, x)) << "x = " << x;
  }
}

TEST_P(Fp8Format, RoundIsDecodeOfEncode) {
  // fp8_round against the codes: every code's value and its neighbours in fp32, the
  // midpoints, and random bit patterns of every class.
  const Spec& f = GetParam();
  auto same = [&](float x) {
    const float want = decode(f, encode(f, x)), got = fp8_round(x, f.dtype);
    if (std::isnan(want)) return std::isnan(got);
    return f32_bits(got) == f32_bits(want);
  };
  for (int c = 0; c < 256; ++c) {
    const float v = decode(f, static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    for (float x : {v, std::nextafter(v, -1e30f), std::nextafter(v, 1e30f), v * 1.0625f, v * 0.96875f})
      ASSERT_TRUE(same(x)) << "x = " << x << " (code " << c << ")";
  }
  std::mt19937 gen(11);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 1 << 20; ++i) {
    const float x = bits_f32(bits(gen));
    ASSERT_TRUE(same(x)) << "x = " << x << " (bits " << std::hex << f32_bits(x) << ")";
    const float y = std::ldexp(x, -static_cast<int>(bits(gen) % 40));  // toward fp8's range
    ASSERT_TRUE(same(y)) << "y = " << y;
  }
  for (float x : {0.f, -0.f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), 0x1p-149f, -0x1p-126f})
    ASSERT_TRUE(same(x)) << "x = " << x;
}

TEST_P(Fp8Format, ScaleIsThePowerOfTwoThatFits) {
  const Spec& f = GetParam();
  const float max = fp8_max(f.dtype);
  EXPECT_EQ(fp8_scale(0.f, f.dtype), 1.f);
  EXPECT_EQ(fp8_scale(max, f.dtype), 1.f);
  EXPECT_EQ(fp8_scale(std::nextafter(max, 1e30f), f.dtype), 0.5f);
  EXPECT_EQ(fp8_scale(max / 2, f.dtype), 2.f);
  EXPECT_EQ(fp8_scale(std::nextafter(max / 2, 0.f), f.dtype), 2.f);
  EXPECT_EQ(fp8_scale(1e-45f, f.dtype), 0x1p127f);  // clamped
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> logmag(-30.f, 30.f);
  for (int i = 0; i < 2000; ++i) {
    const float amax = std::exp2(logmag(gen));
    const double s = fp8_scale(amax, f.dtype);
    ASSERT_EQ(std::exp2(std::round(std::log2(s))), s);  // a power of two
    ASSERT_LE(amax * s, max) << amax;
    ASSERT_GT(amax * s * 2, max) << amax;  // the largest that fits
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Format, ::testing::Values(kE4M3, kE5M2),
                         [](const auto& info) { return std::string(dtype_name(info.param.dtype)); });

TEST(Fp8, ConvertThroughFp32) {
  // convert() goes through fp32: bf16 and fp16 inputs are exact there.
  const std::vector<float> src = {0.f, -1.f, 3.3f, 500.f, -1e6f, 0.001f};
  std::vector<uint8_t> codes(src.size());
  std::vector<float> back(src.size());
  convert(src.data(), DType::F32, codes.data(), DType::E4M3, src.size());
  convert(codes.data(), DType::E4M3, back.data(), DType::F32, src.size());
  const std::vector<float> want = {0.f, -1.f, 3.25f, 448.f, -448.f, 0x1p-9f};  // 0.001 > 2^-10
  EXPECT_EQ(back, want);
  EXPECT_EQ(dtype_size(DType::E4M3), 1u);
  EXPECT_EQ(parse_dtype("fp8_e5m2"), DType::E5M2);
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::E4M3);
}

}  // namespace
}  // namespace kiln

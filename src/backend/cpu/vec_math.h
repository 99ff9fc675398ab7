// Vectorisable elementary functions for the CPU kernels.
//
// glibc's expf/tanhf are scalar calls inside `omp simd` loops unless -ffast-math is on,
// which would relax IEEE semantics everywhere. These inline, branch-free versions let
// GCC vectorise the loops that call them (AVX-512: 16 lanes) at fp32 accuracy:
// exp_approx has a relative error below 2e-7 over [-87, 88] (Cephes expf's polynomial
// after a Cody-Waite range reduction, exp(x) = 2^n * exp(r), |r| <= ln2/2), and
// tanh_approx = sign(x) (1 - e) / (1 + e) with e = exp(-2|x|) <= 1, which cannot overflow.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln::cpu {

#pragma omp declare simd notinbranch
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.3f), 88.7f);
  // n = round(x / ln2), by truncating a value made positive (floorf would not vectorise).
  const float n = static_cast<float>(static_cast<int32_t>(x * 1.44269504088896341f + 127.5f)) - 127.f;
  // r = x - n ln2, with ln2 split in two parts (Cody & Waite) for accuracy.
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * __builtin_bit_cast(float, bits);
}

#pragma omp declare simd notinbranch
inline float tanh_approx(float x) {
  const float e = exp_approx(-2.f * std::abs(x));  // in (0, 1]: no overflow, no clamp
  const float t = (1.f - e) / (1.f + e);
  return x < 0.f ? -t : t;
}

/// sigmoid(x) = 1 / (1 + exp(-x)) from e = exp(-|x|) in (0, 1] (no overflow; clamped
/// to exp_approx's range, where sigmoid is 0 or 1 in fp32 anyway).
#pragma omp declare simd notinbranch
inline float sigmoid_approx(float x) {
  const float e = exp_approx(std::max(-std::abs(x), -87.f));
  return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

/// sech^2(x) = 1 - tanh^2(x), computed as 4e / (1+e)^2 with e = exp(-2|x|), which keeps
/// full relative accuracy where tanh is near +-1 (1 - tanh^2 would cancel).
#pragma omp declare simd notinbranch
inline float sech2_approx(float x) {
  const float e = exp_approx(-2.f * std::abs(x));
  const float inv = 1.f / (1.f + e);
  return 4.f * e * inv * inv;
}

}  // namespace kiln::cpu

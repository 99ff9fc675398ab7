// Element types of the CPU kernels: fp32, bf16 and fp16 in storage, fp32 in registers.
//
// Every kernel is a template over its storage type T (and, for parameter gradients, G):
// it loads elements with load(), computes in fp32 and stores with store<T>(), which
// rounds to nearest even and keeps NaN and Inf (the conversions of core/dtype.h). The
// bf16 conversion here is branch-free so that loops over it vectorise.
#pragma once

#include "core/dtype.h"
#include "core/error.h"

#include <cstdint>

namespace kiln::cpu {

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float load(float x) { return x; }
inline float load(bf16 x) { return __builtin_bit_cast(float, static_cast<uint32_t>(x.bits) << 16); }
inline float load(f16 x) { return f16_to_f32(x.bits); }

template <class T>
T store(float f);
template <>
inline float store<float>(float f) {
  return f;
}
template <>
inline bf16 store<bf16>(float f) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return {static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded)};
}
template <>
inline f16 store<f16>(float f) {
  return {f32_to_f16(f)};
}

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::BF16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::F16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}

/// Calls f(T{}) with T the storage type of `dtype` (fp32, bf16 or fp16); throws for
/// others, naming `op`.
template <class F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: return f(float{});
    case DType::BF16: return f(bf16{});
    case DType::F16: return f(f16{});
    default: break;
  }
  KILN_FAIL("{}: unsupported dtype {}", op, dtype_name(dtype));
}

}  // namespace kiln::cpu

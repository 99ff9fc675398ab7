// fp8 kernels (train.fp8, docs/fp8.md): the tensorwise amax of a tensor on the device,
// and the quantization out = fp8(in S) / S of fp8_linear_forward/_backward's operands at
// S = fp8_scale(amax, format) read from device memory (no host read: both run inside a
// training step). Also, for .cu files only, the device conversions between fp32 and the
// OCP fp8 formats that memory.cu's copy uses: the codes of core/dtype.h bit for bit.
#pragma once

#include "backend/cuda/common.h"
#include "backend/cuda/memory.h"

#include <cstdint>

namespace kiln::cuda {

/// amax[0] (device fp32) = max(amax[0], max |x[i]|) over i < n, x fp32, bf16 or fp16 (kind
/// F32, BF16 or F16): a NaN in x, or in amax[0], makes it NaN; a negative amax[0] (e.g.
/// -0 or -Inf) is replaced as by std::max(a, m) on the CPU (cpu_backend.cpp fp8_amax).
/// One launch, one atomic per block; asynchronous on s.
void fp8_amax(cudaStream_t s, FloatKind k, const void* x, int64_t n, float* amax);

/// Backend::fp8_amax_history on device arrays: history [n,H,k], amax and step_amax [n,k].
void fp8_amax_history(cudaStream_t s, float* amax, float* history, float* step_amax, int64_t n,
                      int64_t H, int64_t k, int64_t slot, bool most_recent);

/// The fp8 GEMMs' operands (cuda_fp8_ops.cpp): the 1-byte codes fp8(x S) of a row-major
/// [rows, cols] x of element type e, S = fp8_scale(*amax, format) exactly as
/// fp8_quantize's (so code / S is fp8_quantize's value), into `codes` (row-major [rows,
/// cols], may be null) and/or `codes_t`, the transpose: row-major [cols, ld_t] with
/// codes_t[c ld_t + r] = code(x[r, c]) and the padding columns rows <= r < ld_t zero
/// (code 0 = +0), ld_t >= rows. A non-finite *amax makes every code a NaN (E4M3 0x7f,
/// E5M2 0x7e). One launch of 32x32 tiles through shared memory; asynchronous on s.
void fp8_quantize_codes(cudaStream_t s, Elem e, uint8_t* codes, uint8_t* codes_t, const void* in,
                        int64_t rows, int64_t cols, int64_t ld_t, const float* amax,
                        DType format);

/// descale[i] = 1 / fp8_scale(amax[i], format i) for i < n (2^-e, exact), the format E5M2
/// where bit i of e5m2_mask is set and E4M3 otherwise; NaN where amax[i] is not finite.
/// The factors cuBLASLt's A/B_SCALE_POINTER read. One tiny launch on s.
void fp8_descale(cudaStream_t s, float* descale, const float* amax, int n, uint32_t e5m2_mask);

/// out[i] = fp8(in[i] S) / S in in's element type e (out may not alias in), S =
/// fp8_scale(*amax, format) (core/dtype.h, the same bits), format E4M3 or E5M2, the
/// conversion saturating with round to nearest even; every out[i] NaN when *amax is not
/// finite (as cpu::fp8_quantize). *amax is read on the device.
void fp8_quantize(cudaStream_t s, Elem e, void* out, const void* in, int64_t n,
                  const float* amax, DType format);

}  // namespace kiln::cuda

#if defined(__CUDACC__)
#include <cuda_fp8.h>

#include <cstring>

namespace kiln::cuda {

// Host and device (the host for tests of the conversions; memcpy is a register move).
__host__ __device__ __forceinline__ uint32_t fp8_f32_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
__host__ __device__ __forceinline__ float fp8_bits_f32(uint32_t u) {
  float v;
  memcpy(&v, &u, 4);
  return v;
}

// fp32 -> fp8 code exactly as core/dtype.cpp's f32_to_e4m3 / f32_to_e5m2.
// __nv_cvt_float_to_fp8(v, __NV_SATFINITE, ...) (cuda_fp8.hpp, CUDA 13.0) is, on sm_89+,
// PTX `cvt.rn.satfinite.{e4m3,e5m2}x2.f32`: round to nearest, ties to even; |v| above the
// largest finite value, +-Inf included, gives +-that value (448 / 57344) with v's sign;
// fp32 subnormals are not flushed (no .ftz; kiln builds without -ftz/--use_fast_math).
// On older architectures and on the host it is the header's software path,
// __nv_cvt_double_to_fp8: the same rounding and saturation. Only NaN differs from core:
// the instruction returns "a NaN" (sign and, for E5M2, payload unspecified), the
// software path 0x7f without the sign; core keeps the sign and returns S.1111.111
// (E4M3) / S.11111.10 (E5M2). NaN is therefore handled here, so copies into fp8 hold
// core's codes bit for bit.
__host__ __device__ __forceinline__ uint8_t f32_to_fp8(float v, bool e4m3) {
  const uint32_t u = fp8_f32_bits(v);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint8_t>(((u >> 24) & 0x80u) | (e4m3 ? 0x7fu : 0x7eu));
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(v, __NV_SATFINITE, e4m3 ? __NV_E4M3 : __NV_E5M2));
}

// fp8 code -> fp32, exact, as core's e4m3_to_f32 / e5m2_to_f32: through fp16 (which holds
// every E4M3 and E5M2 value; __nv_cvt_fp8_to_halfraw is PTX `cvt.rn.f16x2.{e4m3,e5m2}x2`
// on sm_89+, exact), NaN codes as core's NaN (0x7fc00000 with the code's sign), since the
// conversion's NaN is canonical and unsigned.
__host__ __device__ __forceinline__ float fp8_to_f32(uint8_t c, bool e4m3) {
  const uint32_t a = c & 0x7fu;
  if (e4m3 ? a == 0x7fu : a > 0x7cu)
    return fp8_bits_f32((static_cast<uint32_t>(c & 0x80u) << 24) | 0x7fc00000u);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(c, e4m3 ? __NV_E4M3 : __NV_E5M2)));
}

}  // namespace kiln::cuda
#endif

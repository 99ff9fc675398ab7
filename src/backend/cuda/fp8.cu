// fp8_amax: grid-stride over x (16-byte vector loads over the aligned middle, scalar head
// and tail), up to 1024 blocks x 256 threads; each thread keeps the largest |x| as bits
// (magnitudes order as unsigned integers, NaN above Inf), the block reduces with
// __reduce_max_sync (sm_80+) and a shared array, and thread 0 does one atomicMax on the
// uint32 bits of amax[0]. Bytes: n * size read. Order-independent: the result is exact.
// fp8_quantize: grid-stride element-wise, 16-byte vectors when in and out are 16-byte
// aligned; each thread computes S from *amax once (fp8_scale's double ilogb), then per
// element v = x S, code = cvt.rn.satfinite (fp8.h), q = code's value, out = q / S
// (multiplying by 2^-e, exact). Bytes: n * 2 * size. As cpu/fp8.cpp, element for element.
// fp8_quantize_codes (the fp8 GEMMs' operands): 32x32 tiles, 32x8 threads, each thread 4
// elements; the code (fp8_quantize's code, before its decode) is stored row-major
// directly and, for the transposed copy, through a shared tile so that both the reads and
// the transposed writes run along rows. Bytes: n * (size + 1 or 2).
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;
constexpr uint32_t kNaNBits = 0x7fc00000u;  // the canonical fp32 NaN every NaN |x| becomes

// |x| as a raw magnitude in x's own encoding (sign cleared): for IEEE formats the order
// of magnitudes is the order of these integers, and every NaN lies above Inf.
__device__ __forceinline__ uint32_t magnitude(float x) { return __float_as_uint(x) & 0x7fffffffu; }
__device__ __forceinline__ uint32_t magnitude(bf16 x) { return __bfloat16_as_ushort(x) & 0x7fffu; }
__device__ __forceinline__ uint32_t magnitude(__half x) { return __half_as_ushort(x) & 0x7fffu; }

// The largest magnitude of a type as the fp32 bits of |x|, NaN made kNaNBits.
template <class T>
__device__ __forceinline__ uint32_t f32_bits_of(uint32_t m) {
  if constexpr (sizeof(T) == 4) {
    return m > 0x7f800000u ? kNaNBits : m;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return m > 0x7f80u ? kNaNBits : m << 16;  // bf16 is fp32's top half
  } else {
    return m > 0x7c00u ? kNaNBits : __float_as_uint(__half2float(__ushort_as_half(
                                        static_cast<unsigned short>(m))));
  }
}

// 16 bytes of T: the largest magnitude among them.
template <class T>
__device__ __forceinline__ uint32_t magnitude16(const uint4& v) {
  if constexpr (sizeof(T) == 4) {
    return max(max(v.x & 0x7fffffffu, v.y & 0x7fffffffu),
               max(v.z & 0x7fffffffu, v.w & 0x7fffffffu));
  } else {  // two 16-bit values per word
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) m = max(m, max(w[k] & 0x7fffu, (w[k] >> 16) & 0x7fffu));
    return m;
  }
}

// *p = max(*p, bits) for the fp32 bits of a magnitude or kNaNBits, with fp8_amax's order:
// atomicMax on uint32 is right whenever *p is +0, positive or a NaN of either sign
// (NaN bits exceed Inf's, and a negative NaN's exceed everything, so NaN stays NaN).
// A negative non-NaN *p (sign bit set) would wrongly win; the CPU's std::max(a, m)
// replaces it by m (keeping -0 only against m = +0): do so with a CAS. Writers store
// only non-negative bits or kNaNBits, so *p is negative at most until one replacement.
__device__ __forceinline__ void amax_update(uint32_t* p, uint32_t bits) {
  uint32_t cur = atomicMax(p, bits);
  while ((cur & 0x80000000u) && (cur & 0x7fffffffu) <= 0x7f800000u &&
         !(cur == 0x80000000u && bits == 0u)) {
    const uint32_t prev = atomicCAS(p, cur, bits);
    if (prev == cur) break;
    cur = atomicMax(p, bits);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) amax_kernel(const T* x, int64_t n, uint32_t* amax) {
  constexpr int64_t V = 16 / sizeof(T);
  // Elements before the first 16-byte boundary (x is at least T-aligned), then whole
  // vectors, then the rest.
  const auto addr = reinterpret_cast<uintptr_t>(x);
  int64_t head = static_cast<int64_t>(((16 - addr % 16) % 16) / sizeof(T));
  if (head > n) head = n;
  const int64_t nvec = (n - head) / V;
  const int64_t tail = head + nvec * V;
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  uint32_t m = 0;
  if (tid < head) m = magnitude(x[tid]);
  if (tid < n - tail) m = max(m, magnitude(x[tail + tid]));
  const uint4* xv = reinterpret_cast<const uint4*>(x + head);
  for (int64_t i = tid; i < nvec; i += stride) m = max(m, magnitude16<T>(xv[i]));
  m = f32_bits_of<T>(m);

  __shared__ uint32_t warp_most[kThreads / 32];
  m = __reduce_max_sync(0xffffffffu, m);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_most[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < kThreads / 32 ? warp_most[lane] : 0u;
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0) amax_update(amax, m);
  }
}

// core/dtype.cpp's fp8_scale bit for bit: amax finite here; the quotient in double is
// correctly rounded (IEEE division), ilogb exact, 2^e exact for e in [-126, 127].
__host__ __device__ __forceinline__ int scale_exponent(float amax, bool e4m3) {
  if (!(amax > 0.f)) return 0;
  const int e = ilogb((e4m3 ? 448.0 : 57344.0) / static_cast<double>(amax));
  return e < -126 ? -126 : e > 127 ? 127 : e;
}

template <class T>
__device__ __forceinline__ T quantize_one(T x, float scale, float inv, bool e4m3) {
  const float v = to_f(x) * scale;
  return from_f<T>(fp8_to_f32(f32_to_fp8(v, e4m3), e4m3) * inv);
}

template <class T>
__device__ __forceinline__ T nan_of() {
  if constexpr (sizeof(T) == 4) return __uint_as_float(kNaNBits);
  else return __ushort_as_bfloat16(static_cast<unsigned short>(kNaNBits >> 16));  // 0x7fc0 as core
}

// vec: in and out 16-byte aligned, n / V whole vectors then a scalar rest; otherwise
// element by element.
template <class T>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(T* out, const T* in, int64_t n, const float* amax, bool e4m3, bool vec) {
  constexpr int64_t V = 16 / sizeof(T);
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const float a = *amax;
  if (!isfinite(a)) {  // an Inf or NaN in the tensor (or its group): every element NaN
    for (int64_t i = tid; i < n; i += stride) out[i] = nan_of<T>();
    return;
  }
  const int e = scale_exponent(a, e4m3);
  const float scale = ldexpf(1.f, e), inv = ldexpf(1.f, -e);  // exact; 2^-127 subnormal
  if (!vec) {
    for (int64_t i = tid; i < n; i += stride) out[i] = quantize_one(in[i], scale, inv, e4m3);
    return;
  }
  const int64_t nvec = n / V;
  const uint4* iv = reinterpret_cast<const uint4*>(in);
  uint4* ov = reinterpret_cast<uint4*>(out);
  for (int64_t i = tid; i < nvec; i += stride) {
    uint4 w = iv[i];
    T* t = reinterpret_cast<T*>(&w);
#pragma unroll
    for (int k = 0; k < V; ++k) t[k] = quantize_one(t[k], scale, inv, e4m3);
    ov[i] = w;
  }
  if (tid < n - nvec * V) out[nvec * V + tid] = quantize_one(in[nvec * V + tid], scale, inv, e4m3);
}

constexpr int kTile = 32, kTileRows = 8;

template <class T>
__global__ void __launch_bounds__(kTile* kTileRows)
    quantize_codes_kernel(uint8_t* codes, uint8_t* codes_t, const T* in, int64_t rows,
                          int64_t cols, int64_t ld_t, const float* amax, bool e4m3) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float a = *amax;
  const bool finite = isfinite(a);
  const float scale = ldexpf(1.f, finite ? scale_exponent(a, e4m3) : 0);  // exact, as quantize
  const uint8_t nan_code = e4m3 ? 0x7f : 0x7e;  // core's NaN codes (positive sign)
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c0 = int64_t{blockIdx.x} * kTile;
  const int64_t extent = codes_t ? ld_t : rows;  // the transpose's padding rows too
  const int64_t row_tiles = (extent + kTile - 1) / kTile;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTile;
#pragma unroll
    for (int j = 0; j < kTile; j += kTileRows) {
      const int64_t r = r0 + ty + j, c = c0 + tx;
      uint8_t code = 0;  // outside x: the transpose's zero padding
      if (r < rows && c < cols) {
        code = finite ? f32_to_fp8(to_f(in[r * cols + c]) * scale, e4m3) : nan_code;
        if (codes) codes[r * cols + c] = code;
      }
      tile[ty + j][tx] = code;
    }
    if (codes_t) {  // uniform over the block
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kTile; j += kTileRows) {
        const int64_t c = c0 + ty + j, r = r0 + tx;
        if (c < cols && r < ld_t) codes_t[c * ld_t + r] = tile[tx][ty + j];
      }
      __syncthreads();
    }
  }
}

__global__ void descale_kernel(float* descale, const float* amax, int n, uint32_t e5m2_mask) {
  const int i = threadIdx.x;
  if (i >= n) return;
  const float a = amax[i];
  const bool e4m3 = !((e5m2_mask >> i) & 1u);
  descale[i] = isfinite(a) ? ldexpf(1.f, -scale_exponent(a, e4m3)) : __uint_as_float(kNaNBits);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Delayed scaling's step: a thread per (tensor, operand) pair i < n k, over its H slots.
__global__ void amax_history_kernel(float* amax, float* history, float* step_amax, int64_t n,
                                    int64_t H, int64_t k, int64_t slot, bool most_recent) {
  const int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (p >= n * k) return;
  const int64_t i = p / k, j = p % k;
  float* h = history + i * H * k + j;
  h[slot * k] = step_amax[p];
  float m = h[0];  // the max over the window, a NaN kept (as cpu::fp8_amax_history)
  for (int64_t t = 1; t < H; ++t) {
    const float v = h[t * k];
    if (!isnan(m) && (isnan(v) || v > m)) m = v;
  }
  amax[p] = most_recent ? step_amax[p] : m;
  step_amax[p] = 0.f;
}

}  // namespace

void fp8_amax(cudaStream_t s, FloatKind k, const void* x, int64_t n, float* amax) {
  // A thread per 16-byte vector, at most 1024 blocks; one block even for n = 0, which
  // makes amax[0] = max(amax[0], 0) as on the CPU.
  const int64_t per_vector = k == FloatKind::F32 ? 4 : 8;
  const unsigned g = grid_for(n / per_vector, kThreads, 1024);
  auto* a = reinterpret_cast<uint32_t*>(amax);
  switch (k) {
    case FloatKind::F32: amax_kernel<<<g, kThreads, 0, s>>>(static_cast<const float*>(x), n, a); break;
    case FloatKind::BF16: amax_kernel<<<g, kThreads, 0, s>>>(static_cast<const bf16*>(x), n, a); break;
    case FloatKind::F16: amax_kernel<<<g, kThreads, 0, s>>>(static_cast<const __half*>(x), n, a); break;
    default: fail("fp8_amax: x must be fp32, bf16 or fp16");
  }
  KILN_CUDA_LAUNCHED("fp8_amax");
}

void fp8_amax_history(cudaStream_t s, float* amax, float* history, float* step_amax, int64_t n,
                      int64_t H, int64_t k, int64_t slot, bool most_recent) {
  if (n * k == 0) return;
  amax_history_kernel<<<grid_for(n * k, kThreads), kThreads, 0, s>>>(amax, history, step_amax, n,
                                                                     H, k, slot, most_recent);
  KILN_CUDA_LAUNCHED("fp8_amax_history");
}

void fp8_quantize(cudaStream_t s, Elem e, void* out, const void* in, int64_t n,
                  const float* amax, DType format) {
  if (n <= 0) return;
  if (format != DType::E4M3 && format != DType::E5M2) fail("fp8_quantize: format must be E4M3 or E5M2");
  const bool e4m3 = format == DType::E4M3, vec = aligned16(out) && aligned16(in);
  KILN_DISPATCH_ELEM(e, {
    constexpr int64_t V = 16 / sizeof(scalar_t);
    const unsigned g = grid_for(vec ? (n + V - 1) / V : n, kThreads, 4096);
    quantize_kernel<<<g, kThreads, 0, s>>>(static_cast<scalar_t*>(out),
                                           static_cast<const scalar_t*>(in), n, amax, e4m3, vec);
  });
  KILN_CUDA_LAUNCHED("fp8 quantize");
}

void fp8_quantize_codes(cudaStream_t s, Elem e, uint8_t* codes, uint8_t* codes_t, const void* in,
                        int64_t rows, int64_t cols, int64_t ld_t, const float* amax,
                        DType format) {
  if (format != DType::E4M3 && format != DType::E5M2)
    fail("fp8_quantize_codes: format must be E4M3 or E5M2");
  if (codes_t && ld_t < rows) fail("fp8_quantize_codes: ld_t below rows");
  const int64_t extent = codes_t ? ld_t : rows;
  if ((!codes && !codes_t) || extent <= 0 || cols <= 0) return;
  const bool e4m3 = format == DType::E4M3;
  const dim3 block(kTile, kTileRows);
  const int64_t col_tiles = (cols + kTile - 1) / kTile;
  if (col_tiles > 0x7fffffff) fail("fp8_quantize_codes: too many columns");
  const dim3 grid(static_cast<unsigned>(col_tiles),
                  static_cast<unsigned>(std::min<int64_t>((extent + kTile - 1) / kTile, 65535)));
  KILN_DISPATCH_ELEM(e, {
    quantize_codes_kernel<<<grid, block, 0, s>>>(codes, codes_t,
                                                 static_cast<const scalar_t*>(in), rows, cols,
                                                 ld_t, amax, e4m3);
  });
  KILN_CUDA_LAUNCHED("fp8 quantize codes");
}

void fp8_descale(cudaStream_t s, float* descale, const float* amax, int n, uint32_t e5m2_mask) {
  if (n <= 0) return;
  if (n > 32) fail("fp8_descale: at most 32 factors");
  descale_kernel<<<1, 32, 0, s>>>(descale, amax, n, e5m2_mask);
  KILN_CUDA_LAUNCHED("fp8 descale");
}

}  // namespace kiln::cuda

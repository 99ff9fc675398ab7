// fill: one grid-stride store per element (bytes: n * size written).
// convert: one grid-stride load + store per element through fp32 (bytes: n * (src size +
// dst size)); __float2bfloat16_rn / __float2half_rn round to nearest even and keep
// NaN (as a quiet NaN) and Inf, like core/dtype.h's host conversions; fp8 (E4M3, E5M2)
// through fp8.h's f32_to_fp8 / fp8_to_f32: saturating round to nearest even, core's codes.
// convert_columns (copy_columns): the same per element of a column range of each row,
// the source and destination rows strided by their widths; same kinds copy the bits.
// sum_squares: pass 1, grid of up to 1024 blocks x 256 threads, each thread accumulates
// x^2 in double over a grid-stride range, block_sum -> partial[block]; pass 2, one block
// sums the partials in order and adds the total to the accumulator. Bytes: n * size read. FLOPs: 2n (double). Deterministic.
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.h"
#include "backend/cuda/memory.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

namespace kiln::cuda {

namespace {

template <class U>
__global__ void fill_kernel(U* p, U bits, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = bits;
}

// The fp8 storage types: one code byte each.
struct E4M3 {
  uint8_t bits;
};
struct E5M2 {
  uint8_t bits;
};

__device__ __forceinline__ float load_f(const __half x) { return __half2float(x); }
__device__ __forceinline__ float load_f(const bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float load_f(const float x) { return x; }
__device__ __forceinline__ float load_f(const E4M3 x) { return fp8_to_f32(x.bits, true); }
__device__ __forceinline__ float load_f(const E5M2 x) { return fp8_to_f32(x.bits, false); }
template <class D>
__device__ __forceinline__ D store_f(float x);
template <>
__device__ __forceinline__ float store_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 store_f<bf16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half store_f<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ E4M3 store_f<E4M3>(float x) { return {f32_to_fp8(x, true)}; }
template <>
__device__ __forceinline__ E5M2 store_f<E5M2>(float x) { return {f32_to_fp8(x, false)}; }

// fn(T{}) for the storage type T of kind k.
template <class Fn>
void dispatch_kind(FloatKind k, Fn&& fn) {
  switch (k) {
    case FloatKind::F32: fn(float{}); break;
    case FloatKind::BF16: fn(bf16{}); break;
    case FloatKind::F16: fn(__half{}); break;
    case FloatKind::E4M3: fn(E4M3{}); break;
    case FloatKind::E5M2: fn(E5M2{}); break;
  }
}

template <class D, class S>
__global__ void convert_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = store_f<D>(load_f(src[i]));
}

template <class D>
void convert_from(cudaStream_t s, D* dst, const void* src, FloatKind k, int64_t n) {
  const unsigned g = grid_for(n, 256);
  dispatch_kind(k, [&](auto x) {
    using S = decltype(x);
    convert_kernel<<<g, 256, 0, s>>>(dst, static_cast<const S*>(src), n);
  });
}

// A column range of rows: one grid-stride load + store per element.
template <class D, class S>
__global__ void convert_columns_kernel(D* dst, int64_t dst_width, const S* src,
                                       int64_t src_width, int64_t rows, int64_t ncols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * ncols;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / ncols, j = i % ncols;
    if constexpr (std::is_same_v<D, S>)
      dst[n * dst_width + j] = src[n * src_width + j];
    else
      dst[n * dst_width + j] = store_f<D>(load_f(src[n * src_width + j]));
  }
}

template <class D>
void convert_columns_from(cudaStream_t s, D* dst, int64_t dst_width, const void* src,
                          FloatKind k, int64_t src_width, int64_t rows, int64_t ncols) {
  const unsigned g = grid_for(rows * ncols, 256);
  dispatch_kind(k, [&](auto x) {
    using S = decltype(x);
    convert_columns_kernel<<<g, 256, 0, s>>>(dst, dst_width, static_cast<const S*>(src),
                                             src_width, rows, ncols);
  });
}

constexpr int kSumThreads = 256;

int sum_blocks(int64_t n) {
  const int64_t b = (n + kSumThreads * 8 - 1) / (kSumThreads * 8);
  return static_cast<int>(b < 1 ? 1 : b > 1024 ? 1024 : b);
}

template <class T>
__global__ void sum_squares_partial(const T* x, int64_t n, double* partial) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double v = to_f(x[i]);
    acc += v * v;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_partials(const double* partial, int count, double* result) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *result += acc;
}

// One thread per group of 4 elements: one Philox block gives their 4 random words.
// One thread per 4 consecutive elements; the Philox block of the last global index is
// reused while the next falls in it (one block per 4 elements along a contiguous run).
__global__ void stochastic_round_kernel(uint16_t* dst, const float* src, int64_t n,
                                        uint64_t seed, uint64_t stream, int64_t begin,
                                        int64_t row_len, int64_t stride) {
  const int64_t groups = (n + 3) / 4;
  for (int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; q < groups;
       q += int64_t{gridDim.x} * blockDim.x) {
    Philox4 r{};
    uint64_t block = ~uint64_t{0};
    for (int j = 0; j < 4; ++j) {
      const int64_t i = q * 4 + j;
      if (i >= n) break;
      const uint32_t u = __float_as_uint(src[i]);
      if ((u & 0x7f800000u) == 0x7f800000u) {  // Inf or NaN: round to nearest
        dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src[i]));
        continue;
      }
      const auto g = static_cast<uint64_t>(
          row_len == 0 ? begin + i : begin + (i / row_len) * stride + i % row_len);
      if (g / 4 != block) r = philox_block(seed, stream, block = g / 4);
      dst[i] = static_cast<uint16_t>((u + (r[static_cast<int>(g % 4)] & 0xffffu)) >> 16);
    }
  }
}

}  // namespace

void stochastic_round_bf16(cudaStream_t s, void* dst, const float* src, int64_t n, uint64_t seed,
                           uint64_t stream, int64_t begin, int64_t row_len, int64_t stride) {
  if (n == 0) return;
  const int64_t groups = (n + 3) / 4;
  const int grid = static_cast<int>(std::min<int64_t>((groups + 255) / 256, 4096));
  stochastic_round_kernel<<<grid, 256, 0, s>>>(static_cast<uint16_t*>(dst), src, n, seed, stream,
                                               begin, row_len, stride);
  KILN_CUDA_CHECK(cudaGetLastError());
}

void fill_u32(cudaStream_t s, void* p, uint32_t bits, int64_t n) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n, 256), 256, 0, s>>>(static_cast<uint32_t*>(p), bits, n);
  KILN_CUDA_LAUNCHED("fill");
}

void fill_u64(cudaStream_t s, void* p, uint64_t bits, int64_t n) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n, 256), 256, 0, s>>>(static_cast<uint64_t*>(p), bits, n);
  KILN_CUDA_LAUNCHED("fill");
}

void fill_u16(cudaStream_t s, void* p, uint16_t bits, int64_t n) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n, 256), 256, 0, s>>>(static_cast<uint16_t*>(p), bits, n);
  KILN_CUDA_LAUNCHED("fill");
}

void convert(cudaStream_t s, void* dst, FloatKind dst_kind, const void* src, FloatKind src_kind,
             int64_t n) {
  if (n <= 0) return;
  dispatch_kind(dst_kind, [&](auto x) {
    using D = decltype(x);
    convert_from(s, static_cast<D*>(dst), src, src_kind, n);
  });
  KILN_CUDA_LAUNCHED("copy (convert)");
}

void convert_columns(cudaStream_t s, void* dst, FloatKind dst_kind, int64_t dst_width,
                     int64_t dst_col, const void* src, FloatKind src_kind, int64_t src_width,
                     int64_t src_col, int64_t rows, int64_t ncols) {
  if (rows <= 0 || ncols <= 0) return;
  const void* in = static_cast<const char*>(src) + src_col * float_kind_size(src_kind);
  dispatch_kind(dst_kind, [&](auto x) {
    using D = decltype(x);
    convert_columns_from(s, static_cast<D*>(dst) + dst_col, dst_width, in, src_kind, src_width,
                         rows, ncols);
  });
  KILN_CUDA_LAUNCHED("copy_columns");
}

size_t sum_squares_scratch_bytes(int64_t n) { return sizeof(double) * sum_blocks(n); }

void sum_squares(cudaStream_t s, Elem e, const void* x, int64_t n, void* scratch, double* result) {
  const int blocks = sum_blocks(n);
  double* partial = static_cast<double*>(scratch);
  KILN_DISPATCH_ELEM(e, sum_squares_partial<<<blocks, kSumThreads, 0, s>>>(
                            static_cast<const scalar_t*>(x), n, partial));
  KILN_CUDA_LAUNCHED("sum_squares");
  sum_partials<<<1, kSumThreads, 0, s>>>(partial, blocks, result);
  KILN_CUDA_LAUNCHED("sum_squares");
}

}  // namespace kiln::cuda

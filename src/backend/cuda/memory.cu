// fill: one grid-stride store per element (bytes: n * size written).
// sum_squares: pass 1, grid of up to 1024 blocks x 256 threads, each thread accumulates
// x^2 in double over a grid-stride range, block_sum -> partial[block]; pass 2, one block
// sums the partials in order. Bytes: n * size read. FLOPs: 2n (double). Deterministic.
#include "backend/cuda/common.cuh"
#include "backend/cuda/memory.h"

namespace kiln::cuda {

namespace {

template <class U>
__global__ void fill_kernel(U* p, U bits, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = bits;
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
  if (threadIdx.x == 0) *result = acc;
}

}  // namespace

void fill_u32(cudaStream_t s, void* p, uint32_t bits, int64_t n) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n, 256), 256, 0, s>>>(static_cast<uint32_t*>(p), bits, n);
  KILN_CUDA_LAUNCHED("fill");
}

void fill_u16(cudaStream_t s, void* p, uint16_t bits, int64_t n) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n, 256), 256, 0, s>>>(static_cast<uint16_t*>(p), bits, n);
  KILN_CUDA_LAUNCHED("fill");
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

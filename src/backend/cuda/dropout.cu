// Dropout, forward and backward alike (the mask is replayed, never stored).
// Launch: one thread per Philox block of 4 elements (one philox4x32_10 call gives the
// 4 uniforms of elements 4k..4k+3, as core/rng.cpp's dropout), grid-stride, 256
// threads. Bytes 2 n size; ~10 rounds x 6 integer ops per 4 elements.
#include "backend/cuda/common.cuh"
#include "backend/cuda/dropout.h"

namespace kiln::cuda {

namespace {
// Philox blocks of 4 global elements covering [offset, offset + n).
template <class T>
__global__ void dropout_kernel(T* out, const T* inp, int64_t n, float p, float scale,
                               uint64_t seed, uint64_t stream, int64_t offset) {
  const int64_t first = offset / 4, blocks = (offset + n + 3) / 4 - first;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < blocks;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t blk = first + k;
    const Philox4 r = philox_block(seed, stream, static_cast<uint64_t>(blk));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = blk * 4 + j - offset;
      if (i >= 0 && i < n) out[i] = u32_to_uniform(r[j]) >= p ? from_f<T>(to_f(inp[i]) * scale) : from_f<T>(0.f);
    }
  }
}
}  // namespace

void dropout(cudaStream_t s, Elem e, void* out, const void* inp, int64_t n, float p, float scale,
             uint64_t seed, uint64_t stream, uint64_t offset) {
  if (n <= 0) return;
  const auto off = static_cast<int64_t>(offset);
  KILN_DISPATCH_ELEM(e, dropout_kernel<<<grid_for((off + n + 3) / 4 - off / 4, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(out), static_cast<const scalar_t*>(inp), n, p,
                            scale, seed, stream, off));
  KILN_CUDA_LAUNCHED("dropout");
}

}  // namespace kiln::cuda

// The token permutation of a mixture of experts on the GPU: the CPU's results
// (src/backend/cpu/moe_permute.cpp) without float atomics.
//
// The plan, a stable counting sort of the M = N k slots by expert in (token, choice)
// order, with the capacity rule (each expert keeps its first `capacity` slots), in four
// launches over chunks of 256 slots:
//   1. histogram: hist[chunk][e] = the chunk's slots of expert e (integer atomics: exact
//      in any order);
//   2. one block per expert: an exclusive scan of its column over the chunks in order
//      (hist[chunk][e] becomes the expert's slots in earlier chunks), and offsets[e] =
//      min(its total, capacity);
//   3. one block: an exclusive scan of offsets[0, E) in place, offsets[E] = the kept total;
//   4. per chunk, each slot's rank within its expert = the earlier chunks' count + the
//      chunk's earlier slots of that expert (a scan of the chunk's ids in shared memory):
//      row = offsets[e] + rank when rank < capacity, else -1.
// Integer sums in a fixed order: the rows and offsets are exactly the CPU's.
//
// Rows: scatter (moe_permute, moe_unpermute_backward's dexpert_out) one block per slot;
// gather (moe_permute_backward, moe_unpermute) one block per token, each thread its
// columns, summing the token's k slots in choice order in fp32 as the CPU; the weights'
// gradient (moe_row_dots) one warp per slot.
#include "backend/cuda/common.cuh"
#include "backend/cuda/moe_permute.h"

namespace kiln::cuda {

namespace {

constexpr int kChunk = 256;  // slots per block of the plan, and its threads
constexpr int kRowThreads = 128;

int64_t chunks_of(int64_t M) { return (M + kChunk - 1) / kChunk; }

__global__ void plan_histogram(int* hist, const int32_t* expert_idx, int64_t M, int E) {
  const int64_t i = blockIdx.x * int64_t{kChunk} + threadIdx.x;
  if (i >= M) return;
  const int32_t e = expert_idx[i];
  if (e >= 0 && e < E) atomicAdd(hist + blockIdx.x * int64_t{E} + e, 1);
}

// Exclusive prefix sums, in place and in order, of the n values v[i * stride], by one
// block of kChunk threads; returns their total (to every thread).
__device__ int block_exclusive_scan(int* v, int64_t n, int64_t stride) {
  __shared__ int sh[kChunk];
  int run = 0;
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t i = i0 + threadIdx.x;
    const int x = i < n ? v[i * stride] : 0;
    sh[threadIdx.x] = x;
    __syncthreads();
    for (int o = 1; o < kChunk; o <<= 1) {  // inclusive scan of the tile (Hillis-Steele)
      const int add = threadIdx.x >= o ? sh[threadIdx.x - o] : 0;
      __syncthreads();
      sh[threadIdx.x] += add;
      __syncthreads();
    }
    if (i < n) v[i * stride] = run + sh[threadIdx.x] - x;
    run += sh[kChunk - 1];
    __syncthreads();  // the tile's sums are read before the next tile overwrites them
  }
  return run;
}

// Block e: expert e's column of hist scanned over the chunks; offsets[e] = its kept count.
__global__ void plan_scan(int32_t* offsets, int* hist, int64_t chunks, int E, int64_t cap) {
  const int e = blockIdx.x;
  const int total = block_exclusive_scan(hist + e, chunks, E);
  if (threadIdx.x == 0) offsets[e] = static_cast<int32_t>(total < cap ? total : cap);
}

__global__ void plan_offsets(int32_t* offsets, int E) {
  const int total = block_exclusive_scan(offsets, E, 1);
  if (threadIdx.x == 0) offsets[E] = total;
}

__global__ void plan_rows(int32_t* rows, const int* base, const int32_t* offsets,
                          const int32_t* expert_idx, int64_t M, int E, int64_t cap) {
  __shared__ int32_t ids[kChunk];
  const int64_t i = blockIdx.x * int64_t{kChunk} + threadIdx.x;
  ids[threadIdx.x] = i < M ? expert_idx[i] : -1;
  __syncthreads();
  if (i >= M) return;
  const int32_t e = ids[threadIdx.x];
  if (e < 0 || e >= E) {
    rows[i] = -1;
    return;
  }
  int rank = base[blockIdx.x * int64_t{E} + e];
  for (unsigned t = 0; t < threadIdx.x; ++t) rank += ids[t] == e;
  rows[i] = rank < cap ? offsets[e] + rank : -1;
}

template <class T>
__global__ void scatter_rows(T* dst, const T* src, const float* w, const int32_t* rows,
                             int64_t k, int64_t C) {
  const int64_t i = blockIdx.x;  // slot (n, j) = (i / k, i % k)
  const int32_t r = rows[i];
  if (r < 0) return;  // dropped
  const T* x = src + (i / k) * C;
  T* y = dst + int64_t{r} * C;
  if (!w) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) y[c] = x[c];
    return;
  }
  const float s = w[i];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) y[c] = from_f<T>(s * to_f(x[c]));
}

template <class T>
__global__ void gather_rows(T* dst, const T* src, const float* w, const int32_t* rows,
                            int64_t k, int64_t C) {
  const int64_t n = blockIdx.x;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = rows[n * k + j];
      if (r < 0) continue;  // dropped
      const float s = w ? w[n * k + j] : 1.f;
      acc += s * to_f(src[int64_t{r} * C + c]);
    }
    dst[n * C + c] = from_f<T>(acc);
  }
}

template <class T>
__global__ void row_dots(float* dw, const T* dout, const T* src, const int32_t* rows, int64_t M,
                         int64_t k, int64_t C) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x >> 5} + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (i >= M) return;
  const int32_t r = rows[i];
  if (r < 0) {  // dropped: no gradient to its weight
    if (lane == 0) dw[i] = 0.f;
    return;
  }
  const T* g = dout + (i / k) * C;
  const T* x = src + int64_t{r} * C;
  float dot = 0.f;
  for (int64_t c = lane; c < C; c += 32) dot += to_f(g[c]) * to_f(x[c]);
  dot = warp_sum(dot);
  if (lane == 0) dw[i] = dot;
}

}  // namespace

size_t moe_plan_scratch_bytes(int64_t M, int64_t E) {
  return sizeof(int) * static_cast<size_t>(chunks_of(M) * E);
}

void moe_permute_plan(cudaStream_t s, int32_t* offsets, int32_t* rows, const int32_t* expert_idx,
                      int64_t M, int64_t E, int64_t capacity, void* scratch) {
  const int64_t chunks = chunks_of(M);
  const int64_t cap = capacity > 0 ? capacity : M;
  int* hist = static_cast<int*>(scratch);
  const int e32 = static_cast<int>(E);
  if (chunks > 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(hist, 0, moe_plan_scratch_bytes(M, E), s));
    plan_histogram<<<static_cast<unsigned>(chunks), kChunk, 0, s>>>(hist, expert_idx, M, e32);
    KILN_CUDA_LAUNCHED("moe_permute_plan histogram");
  }
  plan_scan<<<static_cast<unsigned>(E), kChunk, 0, s>>>(offsets, hist, chunks, e32, cap);
  KILN_CUDA_LAUNCHED("moe_permute_plan scan");
  plan_offsets<<<1, kChunk, 0, s>>>(offsets, e32);
  KILN_CUDA_LAUNCHED("moe_permute_plan offsets");
  if (chunks == 0) return;
  plan_rows<<<static_cast<unsigned>(chunks), kChunk, 0, s>>>(rows, hist, offsets, expert_idx, M,
                                                             e32, cap);
  KILN_CUDA_LAUNCHED("moe_permute_plan rows");
}

void moe_scatter_rows(cudaStream_t s, Elem e, void* dst, const void* src, const float* w,
                      const int32_t* rows, int64_t N, int64_t k, int64_t C) {
  if (N * k <= 0 || C <= 0) return;
  KILN_DISPATCH_ELEM(e, {
    scatter_rows<scalar_t><<<static_cast<unsigned>(N * k), kRowThreads, 0, s>>>(
        static_cast<scalar_t*>(dst), static_cast<const scalar_t*>(src), w, rows, k, C);
  });
  KILN_CUDA_LAUNCHED("moe_scatter_rows");
}

void moe_gather_rows(cudaStream_t s, Elem e, void* dst, const void* src, const float* w,
                     const int32_t* rows, int64_t N, int64_t k, int64_t C) {
  if (N <= 0 || C <= 0) return;
  KILN_DISPATCH_ELEM(e, {
    gather_rows<scalar_t><<<static_cast<unsigned>(N), kRowThreads, 0, s>>>(
        static_cast<scalar_t*>(dst), static_cast<const scalar_t*>(src), w, rows, k, C);
  });
  KILN_CUDA_LAUNCHED("moe_gather_rows");
}

void moe_row_dots(cudaStream_t s, Elem e, float* dw, const void* dout, const void* src,
                  const int32_t* rows, int64_t N, int64_t k, int64_t C) {
  const int64_t M = N * k;
  if (M <= 0) return;
  constexpr int kWarps = kRowThreads / 32;
  const unsigned blocks = static_cast<unsigned>((M + kWarps - 1) / kWarps);
  KILN_DISPATCH_ELEM(e, {
    row_dots<scalar_t><<<blocks, kRowThreads, 0, s>>>(dw, static_cast<const scalar_t*>(dout),
                                                      static_cast<const scalar_t*>(src), rows, M,
                                                      k, C);
  });
  KILN_CUDA_LAUNCHED("moe_row_dots");
}

}  // namespace kiln::cuda

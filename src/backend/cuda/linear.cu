// Bias gradient: block (32 columns x 8 row lanes) per (column tile, chunk of 64 rows)
// writes a partial column sum; one thread per column then adds the partials in chunk
// order into dbias (fp32 or bf16, independent of dout's type). Bytes: N OC size read;
// N OC FLOPs. No atomics, so reproducible.
// (cuBLASLt's BGRADB epilogue would fuse this into the dweight GEMM, but it overwrites
// rather than accumulates and is not available for fp32; see docs/cuda.md.)
// Bias add: grid-stride over N OC elements, bytes 2 N OC size.
#include "backend/cuda/common.cuh"
#include "backend/cuda/linear.h"

namespace kiln::cuda {

namespace {

constexpr int kRowsPerChunk = 64;
int64_t chunks_of(int64_t N) { return (N + kRowsPerChunk - 1) / kRowsPerChunk; }

template <class T>
__global__ void colsum_partial(float* partial, const T* dout, int64_t N, int64_t OC) {
  __shared__ float sm[8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  const int64_t r0 = blockIdx.y * int64_t{kRowsPerChunk};
  const int64_t r1 = r0 + kRowsPerChunk < N ? r0 + kRowsPerChunk : N;
  float acc = 0.f;
  if (c < OC)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += to_f(dout[r * OC + c]);
  sm[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < OC) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) s += sm[k][threadIdx.x];
    partial[blockIdx.y * OC + c] = s;
  }
}

template <class G>
__global__ void colsum_final(G* dbias, const float* partial, int64_t chunks, int64_t OC) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= OC) return;
  float s = 0.f;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * OC + c];
  dbias[c] = from_f<G>(to_f(dbias[c]) + s);
}

template <class T>
__global__ void add_bias_kernel(T* out, const T* bias, int64_t n, int64_t OC) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_f<T>(to_f(out[i]) + to_f(bias[i % OC]));
}

}  // namespace

size_t bias_backward_scratch_bytes(int64_t N, int64_t OC) {
  return sizeof(float) * static_cast<size_t>(chunks_of(N) * OC);
}

void bias_backward(cudaStream_t s, Elem e, Elem g, void* dbias, const void* dout, int64_t N,
                   int64_t OC, void* scratch) {
  if (N <= 0 || OC <= 0) return;
  const int64_t chunks = chunks_of(N);
  float* partial = static_cast<float*>(scratch);
  KILN_DISPATCH_ELEM(e, {
    colsum_partial<<<dim3(static_cast<unsigned>((OC + 31) / 32), static_cast<unsigned>(chunks)),
                     dim3(32, 8), 0, s>>>(partial, static_cast<const scalar_t*>(dout), N, OC);
    KILN_CUDA_LAUNCHED("linear_backward (dbias partials)");
  });
  KILN_DISPATCH_GRAD(g, colsum_final<<<grid_for(OC, 256), 256, 0, s>>>(
                            static_cast<grad_t*>(dbias), partial, chunks, OC));
  KILN_CUDA_LAUNCHED("linear_backward (dbias)");
}

void add_bias(cudaStream_t s, Elem e, void* out, const void* bias, int64_t N, int64_t OC) {
  const int64_t n = N * OC;
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, add_bias_kernel<<<grid_for(n, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(out), static_cast<const scalar_t*>(bias), n,
                            OC));
  KILN_CUDA_LAUNCHED("linear_forward (bias)");
}

}  // namespace kiln::cuda

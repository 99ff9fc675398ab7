// Residual add. Launch: grid-stride, 256 threads. Bytes 3 n size, n FLOPs: memory-bound.
// Aliasing is safe: each element is read and written by the same thread.
#include "backend/cuda/add.h"
#include "backend/cuda/common.cuh"

namespace kiln::cuda {

namespace {
template <class T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}
}  // namespace

void add(cudaStream_t s, Elem e, void* out, const void* a, const void* b, int64_t n) {
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, add_kernel<<<grid_for(n, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(out), static_cast<const scalar_t*>(a),
                            static_cast<const scalar_t*>(b), n));
  KILN_CUDA_LAUNCHED("add");
}

}  // namespace kiln::cuda

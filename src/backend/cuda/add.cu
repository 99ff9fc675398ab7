// Residual add. Launch: grid-stride, 256 threads. Bytes 3 n size, n FLOPs: memory-bound.
// Aliasing is safe: each element is read and written by the same thread.
// add_columns: the same grid-stride loop over the rows x src_width elements of the column
// range (i -> row i / src_width, column i % src_width); one fmaf per element, as the CPU's
// std::fma, so both backends round alike. Bytes 3 rows src_width size, 2 FLOPs each.
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

template <class T>
__global__ void add_columns_kernel(T* out, int64_t out_width, const T* src, int64_t src_width,
                                   int64_t n, float alpha) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / src_width, j = i - r * src_width;
    T& o = out[r * out_width + j];
    o = from_f<T>(fmaf(alpha, to_f(src[i]), to_f(o)));
  }
}
}  // namespace

void add(cudaStream_t s, Elem e, void* out, const void* a, const void* b, int64_t n) {
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, add_kernel<<<grid_for(n, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(out), static_cast<const scalar_t*>(a),
                            static_cast<const scalar_t*>(b), n));
  KILN_CUDA_LAUNCHED("add");
}

void add_columns(cudaStream_t s, Elem e, void* out, int64_t out_width, int64_t out_col,
                 const void* src, int64_t src_width, int64_t rows, float alpha) {
  const int64_t n = rows * src_width;
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, add_columns_kernel<<<grid_for(n, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(out) + out_col, out_width,
                            static_cast<const scalar_t*>(src), src_width, n, alpha));
  KILN_CUDA_LAUNCHED("add_columns");
}

}  // namespace kiln::cuda

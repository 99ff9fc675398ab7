// Image layout ops: patchify, one thread per output element of the patch rows (a gather;
// consecutive threads write consecutive elements of a row), and its inverse unpatchify,
// one thread per image element.
#include "backend/cuda/common.cuh"
#include "backend/cuda/image.h"

namespace kiln::cuda {
namespace {

template <class T>
__global__ void patchify_kernel(T* out, const float* images, int64_t B, int64_t H, int64_t W,
                                int64_t C, int64_t P, int64_t T_rows) {
  const int64_t pw = W / P, N = (H / P) * pw, D = C * P * P, n = B * N * D;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t e = i % D, row = (i / D) % N, b = i / (D * N);
    const int64_t c = e / (P * P), dy = (e / P) % P, dx = e % P;
    const int64_t y = (row / pw) * P + dy, x = (row % pw) * P + dx;
    out[(b * T_rows + row) * D + e] = from_f<T>(images[((b * H + y) * W + x) * C + c]);
  }
}

// The inverse: one thread per image element (consecutive threads write consecutive
// channels and pixels; reads gather from the patch rows).
template <class T>
__global__ void unpatchify_kernel(float* images, const T* patches, int64_t B, int64_t H,
                                  int64_t W, int64_t C, int64_t P, int64_t T_rows) {
  const int64_t pw = W / P, D = C * P * P, n = B * H * W * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % C, x = (i / C) % W, y = (i / (C * W)) % H, b = i / (C * W * H);
    const int64_t row = (y / P) * pw + x / P, e = (c * P + y % P) * P + x % P;
    images[i] = to_f(patches[(b * T_rows + row) * D + e]);
  }
}

}  // namespace

void unpatchify(cudaStream_t s, Elem e, float* images, const void* patches, int64_t B, int64_t H,
                int64_t W, int64_t C, int64_t P, int64_t T_rows) {
  const int64_t n = B * H * W * C;
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, unpatchify_kernel<<<grid_for(n, 256), 256, 0, s>>>(
                            images, static_cast<const scalar_t*>(patches), B, H, W, C, P,
                            T_rows));
  KILN_CUDA_LAUNCHED("unpatchify");
}

void patchify(cudaStream_t s, Elem e, void* out, const float* images, int64_t B, int64_t H,
              int64_t W, int64_t C, int64_t P, int64_t T_rows) {
  const int64_t n = B * (H / P) * (W / P) * C * P * P;
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, patchify_kernel<<<grid_for(n, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(out), images, B, H, W, C, P, T_rows));
  KILN_CUDA_LAUNCHED("patchify");
}

}  // namespace kiln::cuda

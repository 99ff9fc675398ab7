// RoPE, one thread per rotated pair (b, t, head among the NH + NKV q and k heads, i <
// HD/2), grid-stride, 256 threads. The angle is the fp32 product pos * inv_freq[i], as
// Hugging Face transformers and the CPU backend compute it, with precise cosf/sinf (not
// __cosf: positions reach thousands of radians). In place: each pair is read and written
// by its own thread. Bytes 2 B T (NH + NKV) HD size; ~6 FLOPs + a cos and a sin per pair.
#include "backend/cuda/common.cuh"
#include "backend/cuda/rope.h"

#include <cmath>

namespace kiln::cuda {

namespace {

template <class T>
__global__ void rope_kernel(T* qkv, const int32_t* positions, RopeFreqs f, int64_t BT,
                            int64_t T_, int64_t heads, int64_t W, int64_t HD, float sign) {
  const int64_t half = HD / 2, n = BT * heads * half;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e % half, h = (e / half) % heads, bt = e / (half * heads);
    const int64_t pos = positions ? int64_t{positions[bt]} : bt % T_;
    T* x = qkv + bt * W + h * HD;  // q heads, then k heads: contiguous
    if (pos < 0) {
      x[i] = x[i + half] = from_f<T>(NAN);
      continue;
    }
    const float a = static_cast<float>(pos) * f.inv_freq[i];
    const float c = cosf(a), sn = sign * sinf(a);
    const float x1 = to_f(x[i]), x2 = to_f(x[i + half]);
    x[i] = from_f<T>(x1 * c - x2 * sn);
    x[i + half] = from_f<T>(x2 * c + x1 * sn);
  }
}

}  // namespace

void rope(cudaStream_t s, Elem e, void* qkv, const int32_t* positions, const RopeFreqs& f,
          int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HD, float sign) {
  if (HD / 2 > kRopeMaxHalf) fail("cuda: rope supports head sizes up to 512");
  const int64_t heads = NH + NKV, W = (NH + 2 * NKV) * HD, n = B * T * heads * (HD / 2);
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, rope_kernel<<<grid_for(n, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(qkv), positions, f, B * T, T, heads, W, HD,
                            sign));
  KILN_CUDA_LAUNCHED("rope");
}

}  // namespace kiln::cuda

// DiT's adaLN modulation and gate (Peebles & Xie 2023): one chunk of a per-sample
// conditioning vector, broadcast over the T positions, scales (and shifts) each row.
//
// Forward is element-wise, parallel over rows (b, t). Backward needs column sums over t
// for each (b, c): it runs parallel over (sample, block of kBlock channels), each task
// walking its rows in order with double accumulators, and writes dx in the same pass
// right after reading dout (so dx may alias dout, and the sums do not depend on the
// thread count).
#include "backend/cpu/kernels.h"

#include <algorithm>

namespace kiln::cpu {

namespace {
constexpr int64_t kBlock = 64;
}

template <class T>
void modulate(T* out, const T* x, const T* mod, int64_t B, int64_t T_, int64_t C, int64_t M,
              int64_t scale, int64_t shift, float scale_offset) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T_; ++t) {
      const T* sc = mod + (b * M + scale) * C;
      const T* sh = shift >= 0 ? mod + (b * M + shift) * C : nullptr;
      const T* xr = x + (b * T_ + t) * C;
      T* o = out + (b * T_ + t) * C;
      if (sh) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c)
          o[c] = store<T>(load(xr[c]) * (scale_offset + load(sc[c])) + load(sh[c]));
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] = store<T>(load(xr[c]) * (scale_offset + load(sc[c])));
      }
    }
}

template <class T>
void modulate_backward(T* dx, T* dmod, const T* dout, const T* x, const T* mod, int64_t B,
                       int64_t T_, int64_t C, int64_t M, int64_t scale, int64_t shift,
                       float scale_offset) {
  const int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t c0 = blk * kBlock, w = std::min(kBlock, C - c0);
      const T* sc = mod + (b * M + scale) * C + c0;
      float factor[kBlock];
      double ds[kBlock] = {}, dh[kBlock] = {};
      for (int64_t c = 0; c < w; ++c) factor[c] = scale_offset + load(sc[c]);
      for (int64_t t = 0; t < T_; ++t) {
        const int64_t row = (b * T_ + t) * C + c0;
        const T* dy = dout + row;
        const T* xr = x + row;
        T* dxr = dx ? dx + row : nullptr;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) {
          const float d = load(dy[c]);
          ds[c] += static_cast<double>(d) * load(xr[c]);
          dh[c] += d;
        }
        if (dxr) {
#pragma omp simd
          for (int64_t c = 0; c < w; ++c) dxr[c] = store<T>(load(dy[c]) * factor[c]);
        }
      }
      T* dsc = dmod + (b * M + scale) * C + c0;
      for (int64_t c = 0; c < w; ++c) dsc[c] = store<T>(static_cast<float>(ds[c]));
      if (shift >= 0) {
        T* dsh = dmod + (b * M + shift) * C + c0;
        for (int64_t c = 0; c < w; ++c) dsh[c] = store<T>(static_cast<float>(dh[c]));
      }
    }
}

#define INST_T(T)                                                                           \
  template void modulate<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t,     \
                            int64_t, int64_t, float);                                       \
  template void modulate_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, \
                                     int64_t, int64_t, int64_t, int64_t, float);
KILN_CPU_FOR_EACH_T(INST_T)

}  // namespace kiln::cpu

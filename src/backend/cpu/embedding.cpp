// Token + position embedding (GPT-2). Forward: one row copy-add per (b,t). Backward:
// scatter-add into wte, parallel over channel blocks so no two threads touch the same
// element (deterministic, no atomics); wpe reduced over b, parallel over t.
#include "backend/cpu/kernels.h"

#include "core/error.h"

#include <algorithm>

namespace kiln::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t Vp) {
  bool bad = false;
#pragma omp parallel for schedule(static) reduction(|| : bad)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T;
    const int32_t tok = tokens[bt];
    if (tok < 0 || tok >= Vp) {
      bad = true;
      continue;
    }
    const float* w = wte + static_cast<int64_t>(tok) * C;
    const float* p = wpe + t * C;
    float* o = out + bt * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = w[c] + p[c];
  }
  KILN_CHECK(!bad, "embedding: a token id is outside [0, {})", Vp);
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, int64_t Vp) {
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const int32_t tok = tokens[bt];
      if (tok < 0 || tok >= Vp) continue;
      float* w = dwte + static_cast<int64_t>(tok) * C;
      const float* d = dout + bt * C;
      for (int64_t c = c0; c < c1; ++c) w[c] += d[c];
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float* p = dwpe + t * C;
    for (int64_t b = 0; b < B; ++b) {
      const float* d = dout + (b * T + t) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) p[c] += d[c];
    }
  }
}

}  // namespace kiln::cpu

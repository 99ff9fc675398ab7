// Token (+ learned position) embedding. Forward: one row copy(-add) per (b,t). Backward:
// scatter-add into wte, parallel over channel blocks so no two threads touch the same
// element (deterministic, no atomics); wpe reduced over b, parallel over t, or (explicit
// positions, which may repeat) scatter-added like wte.
#include "backend/cpu/kernels.h"

#include <algorithm>

namespace kiln::cpu {

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const int32_t* positions, const T* wte,
                       const T* wpe, int64_t B, int64_t T_, int64_t C, int64_t Vp, int64_t maxT) {
  bool bad_token = false, bad_pos = false;
#pragma omp parallel for schedule(static) reduction(|| : bad_token, bad_pos)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t t = positions ? positions[bt] : bt % T_;
    const int32_t tok = tokens[bt];
    if (tok < -1 || tok >= Vp) {
      bad_token = true;
      continue;
    }
    T* o = out + bt * C;
    if (tok == -1 && !wpe) {  // held by another vocab-parallel rank
      std::fill(o, o + C, store<T>(0.f));
      continue;
    }
    const T* w = tok >= 0 ? wte + static_cast<int64_t>(tok) * C : nullptr;
    if (!wpe) {
      std::copy(w, w + C, o);
      continue;
    }
    if (t < 0 || t >= maxT) {
      bad_pos = true;
      continue;
    }
    const T* p = wpe + t * C;
    if (!w) {
      std::copy(p, p + C, o);
      continue;
    }
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = store<T>(load(w[c]) + load(p[c]));
  }
  KILN_CHECK(!bad_token, "embedding: a token id is outside [0, {}) and not -1", Vp);
  KILN_CHECK(!bad_pos, "embedding: a position is outside the table [0, {})", maxT);
}

template <class T, class G>
void embedding_backward(G* dwte, G* dwpe, const T* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t B, int64_t T_, int64_t C, int64_t Vp,
                        int64_t maxT) {
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    for (int64_t bt = 0; bt < B * T_; ++bt) {
      const int32_t tok = tokens[bt];
      const T* d = dout + bt * C;
      if (tok >= 0 && tok < Vp) {
        G* w = dwte + static_cast<int64_t>(tok) * C;
        for (int64_t c = c0; c < c1; ++c) w[c] = store<G>(load(w[c]) + load(d[c]));
      }
      if (!dwpe || !positions) continue;
      const int32_t pos = positions[bt];
      if (pos < 0 || pos >= maxT) continue;
      G* p = dwpe + static_cast<int64_t>(pos) * C;
      for (int64_t c = c0; c < c1; ++c) p[c] = store<G>(load(p[c]) + load(d[c]));
    }
  }
  if (!dwpe || positions) return;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T_; ++t) {
    G* p = dwpe + t * C;
    for (int64_t b = 0; b < B; ++b) {
      const T* d = dout + (b * T_ + t) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) p[c] = store<G>(load(p[c]) + load(d[c]));
    }
  }
}

void shard_ids(int32_t* out, const int32_t* ids, int64_t n, int64_t begin, int64_t count) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    out[i] = (id >= begin && id < begin + count) ? static_cast<int32_t>(id - begin) : -1;
  }
}

#define INST_T(T)                                                                          \
  template void embedding_forward<T>(T*, const int32_t*, const int32_t*, const T*, const T*,  \
                                     int64_t, int64_t, int64_t, int64_t, int64_t);
#define INST_TG(T, G)                                                                      \
  template void embedding_backward<T, G>(G*, G*, const T*, const int32_t*, const int32_t*,   \
                                         int64_t, int64_t, int64_t, int64_t, int64_t);
KILN_CPU_FOR_EACH_T(INST_T)
KILN_CPU_FOR_EACH_TG(INST_TG)

}  // namespace kiln::cpu

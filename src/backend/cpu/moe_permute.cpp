// Token permutation of a mixture of experts (as Megatron-core's permute / unpermute): the
// plan (a stable counting sort of the N*k (token, choice) slots by expert, each expert
// keeping its first `capacity` slots in that order when capacity > 0), the rows of the
// tokens scattered into expert order, and gathered back, weighted by the router, with
// their gradients; a dropped slot (row -1) is skipped. Each token's rows are handled by
// one thread (OpenMP over tokens), sums over its k choices in choice order: results do
// not depend on the thread count.
#include "backend/cpu/kernels.h"

#include "core/error.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kiln::cpu {

void moe_permute_plan(int32_t* offsets, int32_t* rows, const int32_t* expert_idx, int64_t N,
                      int64_t k, int64_t E, int64_t capacity) {
  const int64_t M = N * k;
  KILN_CHECK(M <= INT32_MAX, "moe_permute_plan: {} slots do not fit int32 rows", M);
  const int64_t cap = capacity > 0 ? capacity : M;
  std::vector<int64_t> next(static_cast<size_t>(E) + 1, 0);
  for (int64_t i = 0; i < M; ++i) {
    const int32_t e = expert_idx[i];
    KILN_CHECK(e >= 0 && e < E, "moe_permute_plan: expert_idx[{}, {}] = {} is outside [0, E = {})",
               i / k, i % k, e, E);
    ++next[e + 1];
  }
  for (int64_t e = 0; e < E; ++e) next[e + 1] = next[e] + std::min(next[e + 1], cap);
  for (int64_t e = 0; e <= E; ++e) offsets[e] = static_cast<int32_t>(next[e]);
  // Slots in (token, choice) order take their expert's next row while it has room
  // (stable); the rest are dropped.
  for (int64_t i = 0; i < M; ++i) {
    const int32_t e = expert_idx[i];
    rows[i] = next[e] < offsets[e + 1] ? static_cast<int32_t>(next[e]++) : -1;
  }
}

void check_moe_rows(const int32_t* rows, int64_t N, int64_t k, const char* op) {
  const int64_t M = N * k;
  const int64_t kept = M - std::count(rows, rows + M, -1);
  std::vector<char> seen(static_cast<size_t>(M), 0);
  for (int64_t i = 0; i < M; ++i) {
    const int32_t r = rows[i];
    if (r == -1) continue;
    KILN_CHECK(r >= 0 && r < kept && !seen[r],
               "{}: rows[{}, {}] = {} is outside [0, M_kept = {}) or repeated: the kept rows "
               "must be a permutation (moe_permute_plan's; -1 marks a dropped slot)",
               op, i / k, i % k, r, kept);
    seen[r] = 1;
  }
}

template <class T>
void moe_scatter_rows(T* dst, const T* src, const float* w, const int32_t* rows, int64_t N,
                      int64_t k, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = src + n * C;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = rows[n * k + j];
      if (r < 0) continue;  // dropped
      T* y = dst + int64_t{r} * C;
      if (!w) {
        for (int64_t c = 0; c < C; ++c) y[c] = x[c];
        continue;
      }
      const float s = w[n * k + j];
      for (int64_t c = 0; c < C; ++c) y[c] = store<T>(s * load(x[c]));
    }
  }
}

template <class T>
void moe_gather_rows(T* dst, const T* src, const float* w, const int32_t* rows, int64_t N,
                     int64_t k, int64_t C) {
#pragma omp parallel
  {
    std::vector<float> acc(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t r = rows[n * k + j];
        if (r < 0) continue;  // dropped
        const T* x = src + int64_t{r} * C;
        const float s = w ? w[n * k + j] : 1.f;
        for (int64_t c = 0; c < C; ++c) acc[c] += s * load(x[c]);
      }
      for (int64_t c = 0; c < C; ++c) dst[n * C + c] = store<T>(acc[c]);
    }
  }
}

template <class T>
void moe_row_dots(float* dw, const T* dout, const T* src, const int32_t* rows, int64_t N,
                  int64_t k, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = rows[n * k + j];
      if (r < 0) {  // dropped: no gradient to its weight
        dw[n * k + j] = 0.f;
        continue;
      }
      const T* x = src + int64_t{r} * C;
      float dot = 0.f;
      for (int64_t c = 0; c < C; ++c) dot += load(dout[n * C + c]) * load(x[c]);
      dw[n * k + j] = dot;
    }
}

#define INST_T(T)                                                                              \
  template void moe_scatter_rows<T>(T*, const T*, const float*, const int32_t*, int64_t,       \
                                    int64_t, int64_t);                                         \
  template void moe_gather_rows<T>(T*, const T*, const float*, const int32_t*, int64_t,        \
                                   int64_t, int64_t);                                          \
  template void moe_row_dots<T>(float*, const T*, const T*, const int32_t*, int64_t, int64_t,  \
                                int64_t);
KILN_CPU_FOR_EACH_T(INST_T)

}  // namespace kiln::cpu

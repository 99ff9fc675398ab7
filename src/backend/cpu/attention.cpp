// Self-attention on the CPU (causal or bidirectional, multi-head or grouped-query),
// FlashAttention-style in what is kept: forward saves only the row log-sum-exp (lse),
// and backward recomputes the probabilities P = exp(S - lse) (Dao et al. 2022,
// "FlashAttention", algorithm 2/4).
//
// Forward splits work over (b, h) pairs; backward over (b, kv head) so that the query
// heads sharing a key/value head (grouped-query attention) accumulate its dk, dv in one
// thread, in head order. Each thread gathers a head's q, k, v into contiguous [T, HD]
// scratch rows and works on one block of query rows at a time (causal: the lower
// triangle only), so memory is O(T * T) per thread, not per layer. Which keys a query sees
// is a window of key rows per query (attention_windows.h): the causal triangle, every key,
// or only its document's (packed documents, Backend::attention_varlen_forward); a block of
// query rows scores only the union of its rows' windows.
//
// Dropout on the probabilities uses a Philox mask keyed by the element index
// ((b * NH + h) * T + i) * T + j, replayed in backward. With dropout the output is
// O = (P o M / (1-p)) V, and the softmax backward still uses D_i = dO_i . O_i, because
// sum_j P_ij dP_ij = sum_j P~_ij dP~_ij where P~ is the dropped, rescaled P.
#include "backend/cpu/kernels.h"

#include "backend/cpu/vec_math.h"
#include "core/rng.h"

#include <cmath>
#include <limits>
#include <vector>

namespace kiln::cpu {

namespace {

// One head's operands, gathered contiguous: q (pre-multiplied by 1/sqrt(HD)), k, v as
// [T,HD] rows, and k^T, v^T as [HD,T] so that the scores of query i against keys
// 0..i are a vectorised loop over j (an axpy per channel) instead of i dot products.
struct HeadScratch {
  std::vector<float> q, k, v, kt, vt;
  void resize(int64_t T, int64_t HD) {
    for (auto* x : {&q, &k, &v, &kt, &vt}) x->resize(static_cast<size_t>(T * HD));
  }
};

inline float keep_scale(const DropoutSpec& d, uint64_t index) {
  return uniform_at(d.seed, d.stream, d.offset + index) >= d.p ? 1.f / (1.f - d.p) : 0.f;
}

// n rows of HD columns from `rows` (row stride W, first column `col`), times scale.
template <class T>
void gather_q(float* q, const T* rows, int64_t n, int64_t W, int64_t col, int64_t HD,
              float scale) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < HD; ++d) q[t * HD + d] = load(rows[t * W + col + d]) * scale;
}

// n key and value rows (row stride W; k at column koff, v at voff) into k, v [n,HD] and
// k^T, v^T [HD,n].
template <class T>
void gather_kv(HeadScratch& hs, const T* rows, int64_t n, int64_t W, int64_t koff, int64_t voff,
               int64_t HD) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < HD; ++d) {
      const float k = load(rows[t * W + koff + d]), v = load(rows[t * W + voff + d]);
      hs.k[t * HD + d] = k;
      hs.v[t * HD + d] = v;
      hs.kt[d * n + t] = k;
      hs.vt[d * n + t] = v;
    }
}

// Query head h of sequence b and its key/value head h / (NH / NKV).
template <class T>
void gather_head(HeadScratch& hs, const T* qkv, int64_t b, int64_t h, const AttnDims& a,
                 float scale) {
  const int64_t HD = a.HD, W = a.W(), kvh = h / (a.NH / a.NKV);
  const T* rows = qkv + b * a.T * W;
  gather_q(hs.q.data(), rows, a.T, W, h * HD, HD, scale);
  gather_kv(hs, rows, a.T, W, (a.NH + kvh) * HD, (a.NH + a.NKV + kvh) * HD, HD);
}

template <class T>
inline float dot_t(const T* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += load(a[i]) * b[i];
  return s;
}

}  // namespace

// Query rows are processed in blocks of kRows: each row of k^T, v^T, k and v (and each
// accumulator row of dk, dv) is then read once per block instead of once per query, which
// keeps the inner loops in L1 instead of streaming the head's keys from L2 per row.
constexpr int64_t kRows = 8;

// s[r * ld + j] = sum_d q[(i0 + r) * HD + d] * kt[d * T + j] for r < rows, j < n.
inline void block_times_transposed(float* s, int64_t ld, const float* q, int64_t rows,
                                   const float* kt, int64_t n, int64_t T, int64_t HD) {
  for (int64_t r = 0; r < rows; ++r) std::fill(s + r * ld, s + r * ld + n, 0.f);
  for (int64_t d = 0; d < HD; ++d) {
    const float* col = kt + d * T;
    for (int64_t r = 0; r < rows; ++r) {
      const float a = q[r * HD + d];
      float* sr = s + r * ld;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) sr[j] += a * col[j];
    }
  }
}

// s[j] <- exp(s[j] - max) for j < n (n >= 1); returns the sum, the max in `mx`.
inline float exp_row(float* s, int64_t n, float& mx) {
  mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    s[j] = exp_approx(s[j] - mx);
    sum += s[j];
  }
  return sum;
}

// acc[r * HD + d] = sum_j p[r * ld + j] v[j * HD + d] for r < rows, j < n (acc overwritten).
inline void probs_times_values(float* acc, const float* p, int64_t ld, const float* v,
                               int64_t rows, int64_t n, int64_t HD) {
  std::fill(acc, acc + rows * HD, 0.f);
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = v + j * HD;
    for (int64_t r = 0; r < rows; ++r) {
      const float pr = p[r * ld + j];
      float* ar = acc + r * HD;
#pragma omp simd
      for (int64_t d = 0; d < HD; ++d) ar[d] += pr * vj[d];
    }
  }
}

// One block of query rows' gradient contributions (p = P~, ds = dS, rows of stride ld):
// dV_j += sum_r P~_rj dO_r;  dK_j += sum_r dS_rj q_r (q scaled);  dQ_r += dS_rj K_j.
inline void accumulate_grads(float* dq, float* dk, float* dv, const float* p, const float* ds,
                             int64_t ld, const float* q, const float* dout, const float* k,
                             int64_t rows, int64_t n, int64_t HD) {
  for (int64_t j = 0; j < n; ++j) {
    const float* kj = k + j * HD;
    float* dvj = dv + j * HD;
    float* dkj = dk + j * HD;
    for (int64_t r = 0; r < rows; ++r) {
      const float pt = p[r * ld + j], dsr = ds[r * ld + j];
      const float* dor = dout + r * HD;
      const float* qr = q + r * HD;
      float* dqr = dq + r * HD;
#pragma omp simd
      for (int64_t d = 0; d < HD; ++d) {
        dvj[d] += pt * dor[d];
        dkj[d] += dsr * qr[d];
        dqr[d] += dsr * kj[d];
      }
    }
  }
}

// ---- one block of query rows over its keys ---------------------------------------------
// A block's rows r < rows have windows [lo[r], hi[r]) (absolute key rows, KeyWindows); the
// block computes the scores over their union [klo, khi) only, so keys no row sees (past the
// causal diagonal, outside every row's document) cost nothing.

struct BlockKeys {
  int64_t klo = 0, n = 0;  // keys [klo, klo + n)
};

inline BlockKeys block_keys(const int32_t* lo, const int32_t* hi, int64_t rows) {
  int64_t klo = std::numeric_limits<int64_t>::max(), khi = 0;
  for (int64_t r = 0; r < rows; ++r)
    if (lo[r] < hi[r]) {  // an empty window widens nothing
      klo = std::min<int64_t>(klo, lo[r]);
      khi = std::max<int64_t>(khi, hi[r]);
    }
  return khi > klo ? BlockKeys{klo, khi - klo} : BlockKeys{0, 0};
}

// Row r of scores s (keys klo.. of the block) to exp(s - max) inside its window and 0
// outside; returns the sum (0 for an empty window), the max in `mx`.
inline float softmax_numerator(float* sr, int64_t n, int64_t lo, int64_t hi, float& mx) {
  if (hi <= lo) {
    std::fill(sr, sr + n, 0.f);
    mx = -std::numeric_limits<float>::infinity();
    return 0.f;
  }
  const float sum = exp_row(sr + lo, hi - lo, mx);
  std::fill(sr, sr + lo, 0.f);
  std::fill(sr + hi, sr + n, 0.f);
  return sum;
}

template <class T_>
void attention_forward(T_* out, float* lse, const T_* qkv, const AttnDims& a,
                       const KeyWindows& w, const DropoutSpec& dropout) {
  const int64_t B = a.B, T = a.T, NH = a.NH, HD = a.HD, C = NH * HD;
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
#pragma omp parallel
  {
    HeadScratch hs;
    hs.resize(T, HD);
    std::vector<float> s(static_cast<size_t>(kRows * T)), acc(static_cast<size_t>(kRows * HD));
    float inv[kRows];
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      gather_head(hs, qkv, b, h, a, scale);
      for (int64_t i0 = 0; i0 < T; i0 += kRows) {
        const int64_t rows = std::min(kRows, T - i0);
        const int32_t* lo = w.lo.data() + b * T + i0;
        const int32_t* hi = w.hi.data() + b * T + i0;
        const BlockKeys k = block_keys(lo, hi, rows);
        block_times_transposed(s.data(), T, hs.q.data() + i0 * HD, rows, hs.kt.data() + k.klo,
                               k.n, T, HD);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          float* sr = s.data() + r * T;
          float mx = 0.f;
          const float sum = softmax_numerator(sr, k.n, lo[r] - k.klo, hi[r] - k.klo, mx);
          inv[r] = sum > 0.f ? 1.f / sum : 0.f;
          if (dropout.enabled()) {
            const uint64_t row_index = (dropout.global_bh(static_cast<uint64_t>(bh), static_cast<int>(NH)) * T + i) * T;
            for (int64_t j = lo[r]; j < hi[r]; ++j) sr[j - k.klo] *= keep_scale(dropout, row_index + j);
          }
          lse[bh * T + i] = mx + std::log(sum);
        }
        probs_times_values(acc.data(), s.data(), T, hs.v.data() + k.klo * HD, rows, k.n, HD);
        for (int64_t r = 0; r < rows; ++r) {
          T_* o = out + (b * T + i0 + r) * C + h * HD;
          for (int64_t d = 0; d < HD; ++d) o[d] = store<T_>(acc[static_cast<size_t>(r * HD + d)] * inv[r]);
        }
      }
    }
  }
}

template <class T_>
void attention_backward(T_* dqkv, const T_* dout, const T_* qkv, const T_* out, const float* lse,
                        const AttnDims& a, const KeyWindows& w, const DropoutSpec& dropout) {
  const int64_t B = a.B, T = a.T, NH = a.NH, NKV = a.NKV, HD = a.HD, C = NH * HD, W = a.W();
  const int64_t group = NH / NKV;
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
#pragma omp parallel
  {
    HeadScratch hs;
    hs.resize(T, HD);
    const auto th = static_cast<size_t>(T * HD);
    std::vector<float> dq(th), dk(th), dv(th);
    std::vector<float> p(static_cast<size_t>(kRows * T)), dp(static_cast<size_t>(kRows * T));
    std::vector<float> dob(static_cast<size_t>(kRows * HD));
    float Di[kRows];
#pragma omp for schedule(dynamic, 1)
    for (int64_t bk = 0; bk < B * NKV; ++bk) {
      const int64_t b = bk / NKV, kvh = bk % NKV;
      std::fill(dk.begin(), dk.end(), 0.f);
      std::fill(dv.begin(), dv.end(), 0.f);
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const int64_t bh = b * NH + h;
        gather_head(hs, qkv, b, h, a, scale);
        std::fill(dq.begin(), dq.end(), 0.f);
        for (int64_t i0 = 0; i0 < T; i0 += kRows) {
          const int64_t rows = std::min(kRows, T - i0);
          const int32_t* lo = w.lo.data() + b * T + i0;
          const int32_t* hi = w.hi.data() + b * T + i0;
          const BlockKeys k = block_keys(lo, hi, rows);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = i0 + r;
            float* dor = dob.data() + r * HD;
            for (int64_t d = 0; d < HD; ++d) dor[d] = load(dout[(b * T + i) * C + h * HD + d]);
            Di[r] = dot_t(out + (b * T + i) * C + h * HD, dor, HD);
          }
          const float* qb = hs.q.data() + i0 * HD;  // scaled
          block_times_transposed(p.data(), T, qb, rows, hs.kt.data() + k.klo, k.n, T, HD);  // scores
          block_times_transposed(dp.data(), T, dob.data(), rows, hs.vt.data() + k.klo, k.n, T, HD);  // dO.V
          // Per row: P = exp(S - lse) inside the window (0 outside); then p <- P~ (dropped,
          // scaled) and dp <- dS = P (m dP~ - D), ready for the three accumulations below.
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = i0 + r, j0 = lo[r] - k.klo, j1 = std::max(hi[r] - k.klo, j0);
            float* pr = p.data() + r * T;
            float* dpr = dp.data() + r * T;
            const float l = lse[bh * T + i];
            for (int64_t j = 0; j < j0; ++j) pr[j] = 0.f, dpr[j] = 0.f;
            for (int64_t j = j1; j < k.n; ++j) pr[j] = 0.f, dpr[j] = 0.f;
  #pragma omp simd
            for (int64_t j = j0; j < j1; ++j) pr[j] = exp_approx(pr[j] - l);
            if (dropout.enabled()) {
              const uint64_t row_index = (dropout.global_bh(static_cast<uint64_t>(bh), static_cast<int>(NH)) * T + i) * T;
              for (int64_t j = j0; j < j1; ++j) {
                const float m = keep_scale(dropout, row_index + k.klo + j);
                const float pij = pr[j];
                dpr[j] = pij * (m * dpr[j] - Di[r]);
                pr[j] = pij * m;
              }
            } else {
  #pragma omp simd
              for (int64_t j = j0; j < j1; ++j) dpr[j] = pr[j] * (dpr[j] - Di[r]);
            }
          }
          accumulate_grads(dq.data() + i0 * HD, dk.data() + k.klo * HD, dv.data() + k.klo * HD,
                           p.data(), dp.data(), T, qb, dob.data(), hs.k.data() + k.klo * HD, rows,
                           k.n, HD);
        }
        for (int64_t t = 0; t < T; ++t) {
          T_* row = dqkv + (b * T + t) * W + h * HD;
          for (int64_t d = 0; d < HD; ++d) row[d] = store<T_>(dq[t * HD + d] * scale);
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        T_* row = dqkv + (b * T + t) * W;
        for (int64_t d = 0; d < HD; ++d) {
          row[(NH + kvh) * HD + d] = store<T_>(dk[t * HD + d]);
          row[(NH + NKV + kvh) * HD + d] = store<T_>(dv[t * HD + d]);
        }
      }
    }
  }
}

// ---- tiles of a blockwise (ring) attention --------------------------------------------
// The same loops on a q range of qkv against a k range of a separate kv buffer; forward
// merges the tile into fp32 running results by log-sum-exp, backward accumulates fp32
// gradients with the final lse (see Backend::attention_tile_forward). The windows are the
// tile's: w rows [B * q_len], keys counted from the tile's first.

template <class T_>
void attention_tile_forward(float* out, float* lse, const T_* qkv, const T_* kv,
                            const AttnDims& a, int64_t Tk, const AttentionTile& t,
                            const KeyWindows& w) {
  const int64_t B = a.B, T = a.T, NH = a.NH, NKV = a.NKV, HD = a.HD, C = NH * HD, W = a.W();
  const int64_t KW = 2 * NKV * HD, nq = t.q_len, nk = t.k_len;
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
  if (nq == 0 || nk == 0) return;
#pragma omp parallel
  {
    HeadScratch hs;
    hs.resize(std::max(nq, nk), HD);
    std::vector<float> s(static_cast<size_t>(kRows * nk)), acc(static_cast<size_t>(kRows * HD));
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
      gather_q(hs.q.data(), qkv + (b * T + t.q_begin) * W, nq, W, h * HD, HD, scale);
      gather_kv(hs, kv + (b * Tk + t.k_begin) * KW, nk, KW, kvh * HD, (NKV + kvh) * HD, HD);
      for (int64_t i0 = 0; i0 < nq; i0 += kRows) {
        const int64_t rows = std::min(kRows, nq - i0);
        const int32_t* lo = w.lo.data() + b * nq + i0;
        const int32_t* hi = w.hi.data() + b * nq + i0;
        const BlockKeys k = block_keys(lo, hi, rows);
        if (k.n == 0) continue;  // no row of the block sees a key of the tile
        block_times_transposed(s.data(), nk, hs.q.data() + i0 * HD, rows, hs.kt.data() + k.klo,
                               k.n, nk, HD);
        float tile_lse[kRows];
        for (int64_t r = 0; r < rows; ++r) {
          float* sr = s.data() + r * nk;
          float mx = 0.f;
          const float sum = softmax_numerator(sr, k.n, lo[r] - k.klo, hi[r] - k.klo, mx);
          tile_lse[r] = mx + std::log(sum);
          const float inv = sum > 0.f ? 1.f / sum : 0.f;
          for (int64_t j = 0; j < k.n; ++j) sr[j] *= inv;
        }
        probs_times_values(acc.data(), s.data(), nk, hs.v.data() + k.klo * HD, rows, k.n, HD);
        for (int64_t r = 0; r < rows; ++r) {
          if (hi[r] <= lo[r]) continue;  // sees no key here: left as it was
          const int64_t i = t.q_begin + i0 + r;
          float& l = lse[bh * T + i];
          const float lt = tile_lse[r];
          const float lnew = l == -std::numeric_limits<float>::infinity()
                                 ? lt
                                 : std::max(l, lt) + std::log1p(std::exp(-std::abs(l - lt)));
          const float wo = std::exp(l - lnew), wt = std::exp(lt - lnew);
          float* o = out + (b * T + i) * C + h * HD;
          const float* ar = acc.data() + r * HD;
          for (int64_t d = 0; d < HD; ++d) o[d] = wo * o[d] + wt * ar[d];
          l = lnew;
        }
      }
    }
  }
}

template <class T_>
void attention_tile_backward(float* dq_acc, float* dkv, const T_* dout, const T_* qkv,
                             const T_* kv, const T_* out, const float* lse, const AttnDims& a,
                             int64_t Tk, const AttentionTile& t, const KeyWindows& w) {
  const int64_t B = a.B, T = a.T, NH = a.NH, NKV = a.NKV, HD = a.HD, C = NH * HD, W = a.W();
  const int64_t KW = 2 * NKV * HD, nq = t.q_len, nk = t.k_len, group = NH / NKV;
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
  if (nq == 0 || nk == 0) return;
#pragma omp parallel
  {
    HeadScratch hs;
    hs.resize(std::max(nq, nk), HD);
    std::vector<float> dq(static_cast<size_t>(nq * HD)), dk(static_cast<size_t>(nk * HD)),
        dv(static_cast<size_t>(nk * HD));
    std::vector<float> p(static_cast<size_t>(kRows * nk)), dp(static_cast<size_t>(kRows * nk));
    std::vector<float> dob(static_cast<size_t>(kRows * HD));
    float Di[kRows];
#pragma omp for schedule(dynamic, 1)
    for (int64_t bk = 0; bk < B * NKV; ++bk) {
      const int64_t b = bk / NKV, kvh = bk % NKV;
      gather_kv(hs, kv + (b * Tk + t.k_begin) * KW, nk, KW, kvh * HD, (NKV + kvh) * HD, HD);
      std::fill(dk.begin(), dk.end(), 0.f);
      std::fill(dv.begin(), dv.end(), 0.f);
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const int64_t bh = b * NH + h;
        gather_q(hs.q.data(), qkv + (b * T + t.q_begin) * W, nq, W, h * HD, HD, scale);
        std::fill(dq.begin(), dq.end(), 0.f);
        for (int64_t i0 = 0; i0 < nq; i0 += kRows) {
          const int64_t rows = std::min(kRows, nq - i0);
          const int32_t* lo = w.lo.data() + b * nq + i0;
          const int32_t* hi = w.hi.data() + b * nq + i0;
          const BlockKeys k = block_keys(lo, hi, rows);
          if (k.n == 0) continue;
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t row = (b * T + t.q_begin + i0 + r) * C + h * HD;
            float* dor = dob.data() + r * HD;
            for (int64_t d = 0; d < HD; ++d) dor[d] = load(dout[row + d]);
            Di[r] = dot_t(out + row, dor, HD);
          }
          const float* qb = hs.q.data() + i0 * HD;  // scaled
          block_times_transposed(p.data(), nk, qb, rows, hs.kt.data() + k.klo, k.n, nk, HD);
          block_times_transposed(dp.data(), nk, dob.data(), rows, hs.vt.data() + k.klo, k.n, nk, HD);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t j0 = lo[r] - k.klo, j1 = std::max(hi[r] - k.klo, j0);
            float* pr = p.data() + r * nk;
            float* dpr = dp.data() + r * nk;
            const float l = lse[bh * T + t.q_begin + i0 + r];
            for (int64_t j = 0; j < j0; ++j) pr[j] = 0.f, dpr[j] = 0.f;
            for (int64_t j = j1; j < k.n; ++j) pr[j] = 0.f, dpr[j] = 0.f;
#pragma omp simd
            for (int64_t j = j0; j < j1; ++j) {
              pr[j] = exp_approx(pr[j] - l);
              dpr[j] = pr[j] * (dpr[j] - Di[r]);
            }
          }
          accumulate_grads(dq.data() + i0 * HD, dk.data() + k.klo * HD, dv.data() + k.klo * HD,
                           p.data(), dp.data(), nk, qb, dob.data(), hs.k.data() + k.klo * HD, rows,
                           k.n, HD);
        }
        for (int64_t i = 0; i < nq; ++i) {
          float* row = dq_acc + (b * T + t.q_begin + i) * C + h * HD;
          for (int64_t d = 0; d < HD; ++d) row[d] += dq[static_cast<size_t>(i * HD + d)] * scale;
        }
      }
      for (int64_t j = 0; j < nk; ++j) {
        float* row = dkv + (b * Tk + t.k_begin + j) * KW;
        for (int64_t d = 0; d < HD; ++d) {
          row[kvh * HD + d] += dk[static_cast<size_t>(j * HD + d)];
          row[(NKV + kvh) * HD + d] += dv[static_cast<size_t>(j * HD + d)];
        }
      }
    }
  }
}

}  // namespace kiln::cpu

namespace kiln::cpu {

template <class T>
void attention_decode(T* out, T* k_cache, T* v_cache, const T* qkv, const AttnDims& a,
                      int64_t Tmax, int64_t past) {
  const int64_t B = a.B, Tq = a.T, NH = a.NH, HD = a.HD, C = NH * HD, W = a.W();
  const int64_t KV = a.NKV * HD, group = NH / a.NKV;
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tq; ++t) {
      const T* row = qkv + (b * Tq + t) * W;
      std::copy(row + C, row + C + KV, k_cache + (b * Tmax + past + t) * KV);
      std::copy(row + C + KV, row + C + 2 * KV, v_cache + (b * Tmax + past + t) * KV);
    }
#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(past + Tq)), acc(static_cast<size_t>(HD)),
        qf(static_cast<size_t>(HD));
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t t = 0; t < Tq; ++t) {
          for (int64_t d = 0; d < HD; ++d) qf[static_cast<size_t>(d)] = load(qkv[(b * Tq + t) * W + h * HD + d]);
          const int64_t n = past + t + 1, kvoff = (h / group) * HD;
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < n; ++j) {
            s[j] = dot_t(k_cache + (b * Tmax + j) * KV + kvoff, qf.data(), HD) * scale;
            mx = std::max(mx, s[j]);
          }
          float sum = 0.f;
          for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int64_t j = 0; j < n; ++j) {
            const float p = s[j] / sum;
            const T* v = v_cache + (b * Tmax + j) * KV + kvoff;
            for (int64_t d = 0; d < HD; ++d) acc[d] += p * load(v[d]);
          }
          for (int64_t d = 0; d < HD; ++d) out[(b * Tq + t) * C + h * HD + d] = store<T>(acc[d]);
        }
  }
}

#define INST_T(T)                                                                          \
  template void attention_forward<T>(T*, float*, const T*, const AttnDims&, const KeyWindows&, \
                                     const DropoutSpec&);                                    \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const float*,        \
                                      const AttnDims&, const KeyWindows&, const DropoutSpec&); \
  template void attention_decode<T>(T*, T*, T*, const T*, const AttnDims&, int64_t, int64_t); \
  template void attention_tile_forward<T>(float*, float*, const T*, const T*, const AttnDims&, \
                                          int64_t, const AttentionTile&, const KeyWindows&);  \
  template void attention_tile_backward<T>(float*, float*, const T*, const T*, const T*,       \
                                           const T*, const float*, const AttnDims&, int64_t,   \
                                           const AttentionTile&, const KeyWindows&);
KILN_CPU_FOR_EACH_T(INST_T)

}  // namespace kiln::cpu

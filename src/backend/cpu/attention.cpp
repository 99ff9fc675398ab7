// Causal multi-head self-attention on the CPU, FlashAttention-style in what is kept:
// forward saves only the row log-sum-exp (lse), and backward recomputes the
// probabilities P = exp(S - lse) (Dao et al. 2022, "FlashAttention", algorithm 2/4).
//
// Work is split over (b, h) pairs. Each thread gathers its head's q, k, v into
// contiguous [T, HD] scratch rows and works on one [T, T] score block at a time (lower
// triangle only), so memory is O(T * T) per thread, not per layer.
//
// Dropout on the probabilities uses a Philox mask keyed by the element index
// ((b * NH + h) * T + i) * T + j, replayed in backward. With dropout the output is
// O = (P o M / (1-p)) V, and the softmax backward still uses D_i = dO_i . O_i, because
// sum_j P_ij dP_ij = sum_j P~_ij dP~_ij where P~ is the dropped, rescaled P.
#include "backend/cpu/kernels.h"

#include "core/rng.h"

#include <cmath>
#include <limits>
#include <vector>

namespace kiln::cpu {

namespace {

struct HeadScratch {
  std::vector<float> q, k, v, s;  // q,k,v: [T, HD]; s: [T] scores of one query row
  void resize(int64_t T, int64_t HD) {
    q.resize(T * HD);
    k.resize(T * HD);
    v.resize(T * HD);
    s.resize(T);
  }
};

inline float keep_scale(const DropoutSpec& d, uint64_t index) {
  return uniform_at(d.seed, d.stream, index) >= d.p ? 1.f / (1.f - d.p) : 0.f;
}

// Gathers head h of batch b from qkv [B,T,3C] into contiguous [T,HD] rows.
void gather_head(HeadScratch& hs, const float* qkv, int64_t b, int64_t h, int64_t T, int64_t C,
                 int64_t HD) {
  for (int64_t t = 0; t < T; ++t) {
    const float* row = qkv + (b * T + t) * 3 * C + h * HD;
    for (int64_t d = 0; d < HD; ++d) {
      hs.q[t * HD + d] = row[d];
      hs.k[t * HD + d] = row[C + d];
      hs.v[t * HD + d] = row[2 * C + d];
    }
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, const DropoutSpec& dropout) {
  const int64_t HD = C / NH;
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
#pragma omp parallel
  {
    HeadScratch hs;
    hs.resize(T, HD);
    std::vector<float> acc(HD);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      gather_head(hs, qkv, b, h, T, C, HD);
      for (int64_t i = 0; i < T; ++i) {
        const float* qi = hs.q.data() + i * HD;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          const float sij = dot(qi, hs.k.data() + j * HD, HD) * scale;
          hs.s[j] = sij;
          mx = std::max(mx, sij);
        }
        float sum = 0.f;
        for (int64_t j = 0; j <= i; ++j) {
          hs.s[j] = std::exp(hs.s[j] - mx);
          sum += hs.s[j];
        }
        const float inv = 1.f / sum;
        std::fill(acc.begin(), acc.end(), 0.f);
        const uint64_t row_index = static_cast<uint64_t>((bh * T + i) * T);
        for (int64_t j = 0; j <= i; ++j) {
          float p = hs.s[j] * inv;
          if (dropout.enabled()) p *= keep_scale(dropout, row_index + j);
          const float* vj = hs.v.data() + j * HD;
#pragma omp simd
          for (int64_t d = 0; d < HD; ++d) acc[d] += p * vj[d];
        }
        float* o = out + (b * T + i) * C + h * HD;
        for (int64_t d = 0; d < HD; ++d) o[d] = acc[d];
        lse[bh * T + i] = mx + std::log(sum);
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                        const DropoutSpec& dropout) {
  const int64_t HD = C / NH;
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
#pragma omp parallel
  {
    HeadScratch hs;
    hs.resize(T, HD);
    std::vector<float> dq(T * HD), dk(T * HD), dv(T * HD), p(T), dp(T);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      gather_head(hs, qkv, b, h, T, C, HD);
      std::fill(dq.begin(), dq.end(), 0.f);
      std::fill(dk.begin(), dk.end(), 0.f);
      std::fill(dv.begin(), dv.end(), 0.f);
      for (int64_t i = 0; i < T; ++i) {
        const float* qi = hs.q.data() + i * HD;
        const float* doi = dout + (b * T + i) * C + h * HD;
        const float* oi = out + (b * T + i) * C + h * HD;
        const float l = lse[bh * T + i];
        const float Di = dot(doi, oi, HD);
        const uint64_t row_index = static_cast<uint64_t>((bh * T + i) * T);
        float* dqi = dq.data() + i * HD;
        for (int64_t j = 0; j <= i; ++j) {
          const float* kj = hs.k.data() + j * HD;
          const float* vj = hs.v.data() + j * HD;
          const float pij = std::exp(dot(qi, kj, HD) * scale - l);
          const float m = dropout.enabled() ? keep_scale(dropout, row_index + j) : 1.f;
          // dV_j += P~_ij dO_i ; dP_ij = m * (dO_i . V_j) ; dS_ij = P_ij (dP_ij - D_i)
          const float pt = pij * m;
          float* dvj = dv.data() + j * HD;
#pragma omp simd
          for (int64_t d = 0; d < HD; ++d) dvj[d] += pt * doi[d];
          const float dpij = m * dot(doi, vj, HD);
          const float ds = pij * (dpij - Di) * scale;
          float* dkj = dk.data() + j * HD;
#pragma omp simd
          for (int64_t d = 0; d < HD; ++d) {
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        float* row = dqkv + (b * T + t) * 3 * C + h * HD;
        for (int64_t d = 0; d < HD; ++d) {
          row[d] = dq[t * HD + d];
          row[C + d] = dk[t * HD + d];
          row[2 * C + d] = dv[t * HD + d];
        }
      }
    }
  }
}

}  // namespace kiln::cpu

namespace kiln::cpu {

void attention_decode(float* out, float* k_cache, float* v_cache, const float* qkv, int64_t B,
                      int64_t Tq, int64_t Tmax, int64_t C, int64_t NH, int64_t past) {
  const int64_t HD = C / NH;
  const float scale = 1.f / std::sqrt(static_cast<float>(HD));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tq; ++t) {
      const float* row = qkv + (b * Tq + t) * 3 * C;
      std::copy(row + C, row + 2 * C, k_cache + (b * Tmax + past + t) * C);
      std::copy(row + 2 * C, row + 3 * C, v_cache + (b * Tmax + past + t) * C);
    }
#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(past + Tq)), acc(static_cast<size_t>(HD));
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t t = 0; t < Tq; ++t) {
          const float* q = qkv + (b * Tq + t) * 3 * C + h * HD;
          const int64_t n = past + t + 1;
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < n; ++j) {
            s[j] = dot(q, k_cache + (b * Tmax + j) * C + h * HD, HD) * scale;
            mx = std::max(mx, s[j]);
          }
          float sum = 0.f;
          for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int64_t j = 0; j < n; ++j) {
            const float p = s[j] / sum;
            const float* v = v_cache + (b * Tmax + j) * C + h * HD;
            for (int64_t d = 0; d < HD; ++d) acc[d] += p * v[d];
          }
          std::copy(acc.begin(), acc.end(), out + (b * Tq + t) * C + h * HD);
        }
  }
}

}  // namespace kiln::cpu

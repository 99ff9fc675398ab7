// The mixture-of-experts router (Backend::moe_router_forward / _backward): per token,
// softmax or sigmoid scores of its fp32 logits, the top k experts by score + bias (ties to
// the lower index), and their weights, renormalised or not; backward through the
// renormalisation and the scoring. OpenMP over tokens; each row is computed alone, so
// results do not depend on the thread count. The balancing statistics and their gradients
// (Backend::moe_balance_stats / _backward) are here too: they read the same logits.
#include "backend/cpu/kernels.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::cpu {

namespace {

// The renormalisation's denominator (DeepSeek-V3's + 1e-20: no effect on a sum of fp32
// scores of ordinary size, a guard where sigmoid scores underflow).
constexpr float kRenormEps = 1e-20f;

// scores s[E] of one row of logits l[E].
void score_row(float* s, const float* l, int64_t E, MoeScoring scoring) {
  if (scoring == MoeScoring::Sigmoid) {
    for (int64_t e = 0; e < E; ++e) s[e] = 1.f / (1.f + std::exp(-l[e]));
    return;
  }
  float mx = l[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
  float sum = 0.f;
  for (int64_t e = 0; e < E; ++e) sum += s[e] = std::exp(l[e] - mx);
  const float inv = 1.f / sum;
  for (int64_t e = 0; e < E; ++e) s[e] *= inv;
}

// The k experts of largest key[e] in decreasing order, equal keys to the lower index: k
// passes of a strict comparison (no sort, so a NaN key cannot upset anything).
void top_k(int32_t* idx, const float* key, int64_t E, int k, std::vector<char>& taken) {
  taken.assign(static_cast<size_t>(E), 0);
  for (int j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e)
      if (!taken[e] && (best < 0 || key[e] > key[best])) best = e;
    taken[best] = 1;
    idx[j] = static_cast<int32_t>(best);
  }
}

}  // namespace

void moe_router_forward(float* scores, int32_t* expert_idx, float* expert_weight,
                        const float* logits, const float* bias, int64_t N, int64_t E,
                        const MoeRouterSpec& spec) {
  const int k = spec.k;
#pragma omp parallel
  {
    std::vector<float> key(static_cast<size_t>(E));
    std::vector<char> taken;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* s = scores + n * E;
      score_row(s, logits + n * E, E, spec.scoring);
      for (int64_t e = 0; e < E; ++e) key[e] = bias ? s[e] + bias[e] : s[e];
      int32_t* idx = expert_idx + n * k;
      if (spec.round_robin) {
        for (int j = 0; j < k; ++j) idx[j] = static_cast<int32_t>((n * k + j) % E);
      } else {
        top_k(idx, key.data(), E, k, taken);
      }
      float* w = expert_weight + n * k;
      float sum = 0.f;
      for (int j = 0; j < k; ++j) sum += w[j] = s[idx[j]];
      if (!spec.renormalize) continue;
      const float denom = sum + kRenormEps;
      for (int j = 0; j < k; ++j) w[j] /= denom;
    }
  }
}

void moe_router_backward(float* dlogits, const float* dexpert_weight, const float* dscores,
                         const float* scores, const int32_t* expert_idx, int64_t N, int64_t E,
                         const MoeRouterSpec& spec) {
  const int k = spec.k;
#pragma omp parallel
  {
    std::vector<float> ds(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* s = scores + n * E;
      const float* g = dexpert_weight + n * k;
      const int32_t* idx = expert_idx + n * k;
      for (int64_t e = 0; e < E; ++e) ds[e] = dscores ? dscores[n * E + e] : 0.f;
      if (spec.renormalize) {
        // w_j = s_j / S: ds_j = (g_j - sum_l g_l w_l) / S.
        float S = 0.f;
        for (int j = 0; j < k; ++j) S += s[idx[j]];
        S += kRenormEps;
        float gw = 0.f;
        for (int j = 0; j < k; ++j) gw += g[j] * (s[idx[j]] / S);
        for (int j = 0; j < k; ++j) ds[idx[j]] += (g[j] - gw) / S;
      } else {
        for (int j = 0; j < k; ++j) ds[idx[j]] += g[j];
      }
      float* dl = dlogits + n * E;
      if (spec.scoring == MoeScoring::Sigmoid) {
        for (int64_t e = 0; e < E; ++e) dl[e] = ds[e] * s[e] * (1.f - s[e]);
        continue;
      }
      float dot = 0.f;
      for (int64_t e = 0; e < E; ++e) dot += ds[e] * s[e];
      for (int64_t e = 0; e < E; ++e) dl[e] = s[e] * (ds[e] - dot);
    }
  }
}

namespace {

// Row n's balancing probabilities p[E] (softmax, or the sigmoids normalised to sum 1) and
// its log-sum-exp, in double; sig[E] gets the sigmoids for the Sigmoid backward.
double balance_row(double* p, double* sig, const float* l, int64_t E, MoeScoring scoring) {
  double mx = l[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(l[e]));
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
  const double lse = mx + std::log(sum);
  if (scoring == MoeScoring::Softmax) {
    for (int64_t e = 0; e < E; ++e) p[e] = std::exp(l[e] - lse);
    return lse;
  }
  double S = 0.0;
  for (int64_t e = 0; e < E; ++e) S += sig[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(l[e])));
  for (int64_t e = 0; e < E; ++e) p[e] = sig[e] / S;
  return lse;
}

}  // namespace

void moe_balance_stats(float* load, float* prob, float* z, const float* logits,
                       const int32_t* expert_idx, int64_t N, int64_t E, int64_t k,
                       MoeScoring scoring, float prob_scale, float z_scale) {
  // Rows in order, one thread: the sums are bitwise reproducible (N x E is small).
  std::vector<double> p(static_cast<size_t>(E)), sig(static_cast<size_t>(E)), psum(p.size(), 0.0);
  std::vector<int64_t> count(p.size(), 0);
  double zsum = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const double lse = balance_row(p.data(), sig.data(), logits + n * E, E, scoring);
    for (int64_t e = 0; e < E; ++e) psum[e] += p[e];
    zsum += lse * lse;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = expert_idx[n * k + j];
      KILN_CHECK(e >= 0 && e < E, "moe_balance_stats: expert id {} at ({}, {}) is outside [0, {})",
                 e, n, j, E);
      ++count[e];
    }
  }
  for (int64_t e = 0; e < E; ++e) {
    if (load) load[e] += static_cast<float>(count[e]);
    if (prob) prob[e] += static_cast<float>(prob_scale * psum[e]);
  }
  if (z) z[0] += static_cast<float>(z_scale * zsum);
}

void moe_balance_backward(float* dlogits, const float* logits, const float* load, int64_t N,
                          int64_t E, MoeScoring scoring, float aux_scale, float z_scale) {
#pragma omp parallel
  {
    std::vector<double> p(static_cast<size_t>(E)), sig(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* l = logits + n * E;
      float* dl = dlogits + n * E;
      const double lse = balance_row(p.data(), sig.data(), l, E, scoring);
      if (load) {
        double gp = 0.0;  // sum_f g_f p_f
        for (int64_t e = 0; e < E; ++e) gp += static_cast<double>(aux_scale) * load[e] * p[e];
        double S = 0.0;
        for (int64_t e = 0; e < E; ++e) S += sig[e];
        for (int64_t e = 0; e < E; ++e) {
          const double a = static_cast<double>(aux_scale) * load[e] - gp;
          dl[e] += static_cast<float>(scoring == MoeScoring::Softmax
                                          ? p[e] * a
                                          : sig[e] * (1.0 - sig[e]) * a / S);
        }
      }
      if (z_scale == 0.f) continue;
      for (int64_t e = 0; e < E; ++e)
        dl[e] += static_cast<float>(2.0 * z_scale * lse * std::exp(l[e] - lse));
    }
  }
}

}  // namespace kiln::cpu

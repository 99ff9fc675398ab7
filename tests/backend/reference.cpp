#include "reference.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace kiln::ref {

Vec embedding_forward(const std::vector<int32_t>& tokens, const Vec& wte, const Vec& wpe, int B,
                      int T, int C, const std::vector<int32_t>& positions) {
  Vec out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int64_t tok = tokens[b * T + t];
      const int64_t pos = positions.empty() ? t : positions[b * T + t];
      for (int c = 0; c < C; ++c)
        out[(static_cast<size_t>(b) * T + t) * C + c] =
            wte[tok * C + c] + (wpe.empty() ? 0.0 : wpe[pos * C + c]);
    }
  return out;
}

void embedding_backward(Vec& dwte, Vec& dwpe, const Vec& dout, const std::vector<int32_t>& tokens,
                        int B, int T, int C, int Vp, int maxT,
                        const std::vector<int32_t>& positions) {
  dwte.assign(static_cast<size_t>(Vp) * C, 0.0);
  dwpe.assign(static_cast<size_t>(maxT) * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int64_t tok = tokens[b * T + t];
      const int64_t pos = positions.empty() ? t : positions[b * T + t];
      for (int c = 0; c < C; ++c) {
        const double g = dout[(static_cast<size_t>(b) * T + t) * C + c];
        dwte[tok * C + c] += g;
        if (maxT > 0) dwpe[pos * C + c] += g;
      }
    }
}

void layernorm_forward(Vec& out, Vec& mean, Vec& rstd, const Vec& inp, const Vec& weight,
                       const Vec& bias, int N, int C, double eps) {
  out.assign(static_cast<size_t>(N) * C, 0.0);
  mean.assign(N, 0.0);
  rstd.assign(N, 0.0);
  for (int n = 0; n < N; ++n) {
    const double* x = &inp[static_cast<size_t>(n) * C];
    double m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    double var = 0;
    for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    var /= C;
    const double r = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c)
      out[static_cast<size_t>(n) * C + c] = (x[c] - m) * r * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = r;
  }
}

void layernorm_backward(Vec& dinp, Vec& dweight, Vec& dbias, const Vec& dout, const Vec& inp,
                        const Vec& weight, const Vec& mean, const Vec& rstd, int N, int C) {
  dinp.assign(static_cast<size_t>(N) * C, 0.0);
  dweight.assign(C, 0.0);
  dbias.assign(C, 0.0);
  for (int n = 0; n < N; ++n) {
    const size_t row = static_cast<size_t>(n) * C;
    // y = xhat * w + b, xhat = (x - mean) * rstd.
    // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * w.
    double mean_dxhat = 0, mean_dxhat_xhat = 0;
    for (int c = 0; c < C; ++c) {
      const double xhat = (inp[row + c] - mean[n]) * rstd[n];
      const double dxhat = dout[row + c] * weight[c];
      mean_dxhat += dxhat;
      mean_dxhat_xhat += dxhat * xhat;
      dweight[c] += dout[row + c] * xhat;
      dbias[c] += dout[row + c];
    }
    mean_dxhat /= C;
    mean_dxhat_xhat /= C;
    for (int c = 0; c < C; ++c) {
      const double xhat = (inp[row + c] - mean[n]) * rstd[n];
      const double dxhat = dout[row + c] * weight[c];
      dinp[row + c] = rstd[n] * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
    }
  }
}

Vec linear_forward(const Vec& inp, const Vec& weight, const Vec& bias, int N, int IC, int OC) {
  Vec out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int i = 0; i < IC; ++i)
        s += inp[static_cast<size_t>(n) * IC + i] * weight[static_cast<size_t>(o) * IC + i];
      out[static_cast<size_t>(n) * OC + o] = s;
    }
  return out;
}

void linear_backward(Vec& dinp, Vec& dweight, Vec& dbias, const Vec& dout, const Vec& inp,
                     const Vec& weight, int N, int IC, int OC) {
  dinp.assign(static_cast<size_t>(N) * IC, 0.0);
  dweight.assign(static_cast<size_t>(OC) * IC, 0.0);
  dbias.assign(OC, 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      const double g = dout[static_cast<size_t>(n) * OC + o];
      dbias[o] += g;
      for (int i = 0; i < IC; ++i) {
        dinp[static_cast<size_t>(n) * IC + i] += g * weight[static_cast<size_t>(o) * IC + i];
        dweight[static_cast<size_t>(o) * IC + i] += g * inp[static_cast<size_t>(n) * IC + i];
      }
    }
}

namespace {
struct AttnIdx {
  int T, NH, NKV, HD;
  bool causal;
  // qkv [B,T,W], W = (NH+2NKV)*HD: q head h at h*HD, k head g at (NH+g)*HD, v head g at
  // (NH+NKV+g)*HD; query head h reads kv head h / (NH/NKV).
  int W() const { return (NH + 2 * NKV) * HD; }
  int kv(int h) const { return h / (NH / NKV); }
  size_t row(int b, int t) const { return (static_cast<size_t>(b) * T + t) * W(); }
  size_t q(int b, int t, int h) const { return row(b, t) + static_cast<size_t>(h) * HD; }
  size_t k(int b, int t, int h) const { return row(b, t) + static_cast<size_t>(NH + kv(h)) * HD; }
  size_t v(int b, int t, int h) const {
    return row(b, t) + static_cast<size_t>(NH + NKV + kv(h)) * HD;
  }
  size_t o(int b, int t, int h) const {
    return (static_cast<size_t>(b) * T + t) * NH * HD + static_cast<size_t>(h) * HD;
  }
  size_t m(int b, int h, int t, int j) const {
    return ((static_cast<size_t>(b) * NH + h) * T + t) * T + j;
  }
  int keys(int t) const { return causal ? t + 1 : T; }  // keys 0..keys(t)-1 are seen
};

AttnIdx index(const Attn& a) { return {a.T, a.NH, a.NKV, a.HD, a.causal}; }

// Probabilities P[j] (j < keys(t)) and lse of row t, for (b, h).
void attn_probs(const Vec& qkv, const AttnIdx& ix, int b, int h, int t, Vec& P, double& lse) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(ix.HD));
  const int n = ix.keys(t);
  P.assign(n, 0.0);
  double mx = -std::numeric_limits<double>::infinity();
  for (int j = 0; j < n; ++j) {
    double s = 0;
    for (int d = 0; d < ix.HD; ++d) s += qkv[ix.q(b, t, h) + d] * qkv[ix.k(b, j, h) + d];
    P[j] = s * scale;
    mx = std::max(mx, P[j]);
  }
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += std::exp(P[j] - mx);
  lse = mx + std::log(sum);
  for (int j = 0; j < n; ++j) P[j] = std::exp(P[j] - lse);
}
}  // namespace

void attention_forward(Vec& out, Vec& lse, const Vec& qkv, const Attn& a,
                       const std::vector<uint8_t>& keep, double p) {
  const AttnIdx ix = index(a);
  out.assign(static_cast<size_t>(a.B) * a.T * a.NH * a.HD, 0.0);
  lse.assign(static_cast<size_t>(a.B) * a.NH * a.T, 0.0);
  Vec P;
  for (int b = 0; b < a.B; ++b)
    for (int h = 0; h < a.NH; ++h)
      for (int t = 0; t < a.T; ++t) {
        double l;
        attn_probs(qkv, ix, b, h, t, P, l);
        lse[(static_cast<size_t>(b) * a.NH + h) * a.T + t] = l;
        for (int j = 0; j < ix.keys(t); ++j) {
          const double pd = keep.empty() ? P[j] : P[j] * keep[ix.m(b, h, t, j)] / (1.0 - p);
          for (int d = 0; d < ix.HD; ++d) out[ix.o(b, t, h) + d] += pd * qkv[ix.v(b, j, h) + d];
        }
      }
}

Vec attention_backward(const Vec& dout, const Vec& qkv, const Attn& a,
                       const std::vector<uint8_t>& keep, double p) {
  const AttnIdx ix = index(a);
  const double scale = 1.0 / std::sqrt(static_cast<double>(ix.HD));
  Vec dqkv(qkv.size(), 0.0);
  Vec P, dP;
  for (int b = 0; b < a.B; ++b)
    for (int h = 0; h < a.NH; ++h)
      for (int t = 0; t < a.T; ++t) {
        double l;
        attn_probs(qkv, ix, b, h, t, P, l);
        const int n = ix.keys(t);
        dP.assign(n, 0.0);
        double D = 0;
        for (int j = 0; j < n; ++j) {
          const double mult = keep.empty() ? 1.0 : keep[ix.m(b, h, t, j)] / (1.0 - p);
          double dpd = 0;  // d out_t / d Pdrop_j . dout_t
          for (int d = 0; d < ix.HD; ++d) {
            dpd += dout[ix.o(b, t, h) + d] * qkv[ix.v(b, j, h) + d];
            dqkv[ix.v(b, j, h) + d] += P[j] * mult * dout[ix.o(b, t, h) + d];
          }
          dP[j] = dpd * mult;
          D += P[j] * dP[j];
        }
        for (int j = 0; j < n; ++j) {
          const double dS = P[j] * (dP[j] - D) * scale;
          for (int d = 0; d < ix.HD; ++d) {
            dqkv[ix.q(b, t, h) + d] += dS * qkv[ix.k(b, j, h) + d];
            dqkv[ix.k(b, j, h) + d] += dS * qkv[ix.q(b, t, h) + d];
          }
        }
      }
  return dqkv;
}

namespace {
// The runs [begin, end) of rows (over B*T) that cu's documents and the sequences' ends cut.
std::vector<std::pair<int64_t, int64_t>> document_runs(const Attn& a, const std::vector<int32_t>& cu) {
  std::vector<int64_t> cuts(cu.begin(), cu.end());
  for (int b = 0; b <= a.B; ++b) cuts.push_back(int64_t{b} * a.T);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) runs.emplace_back(cuts[i], cuts[i + 1]);
  return runs;
}
}  // namespace

void attention_documents_forward(Vec& out, Vec& lse, const Vec& qkv, const Attn& a,
                                 const std::vector<int32_t>& cu) {
  const size_t W = static_cast<size_t>(a.NH + 2 * a.NKV) * a.HD, C = static_cast<size_t>(a.NH) * a.HD;
  out.assign(static_cast<size_t>(a.B) * a.T * C, 0.0);
  lse.assign(static_cast<size_t>(a.B) * a.NH * a.T, 0.0);
  for (const auto& [begin, end] : document_runs(a, cu)) {
    const int n = static_cast<int>(end - begin);
    const Vec piece(qkv.begin() + static_cast<std::ptrdiff_t>(begin * W),
                    qkv.begin() + static_cast<std::ptrdiff_t>(end * W));
    Vec o, l;
    attention_forward(o, l, piece, Attn{1, n, a.NH, a.NKV, a.HD, a.causal}, {}, 0.0);
    std::copy(o.begin(), o.end(), out.begin() + static_cast<std::ptrdiff_t>(begin * C));
    const int64_t b = begin / a.T, t0 = begin % a.T;
    for (int h = 0; h < a.NH; ++h)
      for (int t = 0; t < n; ++t)
        lse[static_cast<size_t>((b * a.NH + h) * a.T + t0 + t)] = l[static_cast<size_t>(h * n + t)];
  }
}

Vec attention_documents_backward(const Vec& dout, const Vec& qkv, const Attn& a,
                                 const std::vector<int32_t>& cu) {
  const size_t W = static_cast<size_t>(a.NH + 2 * a.NKV) * a.HD, C = static_cast<size_t>(a.NH) * a.HD;
  Vec dqkv(qkv.size(), 0.0);
  for (const auto& [begin, end] : document_runs(a, cu)) {
    const int n = static_cast<int>(end - begin);
    const Vec piece(qkv.begin() + static_cast<std::ptrdiff_t>(begin * W),
                    qkv.begin() + static_cast<std::ptrdiff_t>(end * W));
    const Vec dpiece(dout.begin() + static_cast<std::ptrdiff_t>(begin * C),
                     dout.begin() + static_cast<std::ptrdiff_t>(end * C));
    const Vec d = attention_backward(dpiece, piece, Attn{1, n, a.NH, a.NKV, a.HD, a.causal}, {}, 0.0);
    std::copy(d.begin(), d.end(), dqkv.begin() + static_cast<std::ptrdiff_t>(begin * W));
  }
  return dqkv;
}

void rope(Vec& qkv, const std::vector<int32_t>& positions, const std::vector<float>& inv_freq,
          const Attn& a, double sign) {
  const int half = a.HD / 2, W = (a.NH + 2 * a.NKV) * a.HD;
  for (int b = 0; b < a.B; ++b)
    for (int t = 0; t < a.T; ++t) {
      const size_t bt = static_cast<size_t>(b) * a.T + t;
      const int pos = positions.empty() ? t : positions[bt];
      for (int h = 0; h < a.NH + a.NKV; ++h)
        for (int i = 0; i < half; ++i) {
          // The angle as the interface defines it: an fp32 product, then exact trig.
          const double ang = static_cast<double>(static_cast<float>(pos) * inv_freq[i]);
          const double c = std::cos(ang), s = sign * std::sin(ang);
          double* x = &qkv[bt * W + static_cast<size_t>(h) * a.HD];
          const double x1 = x[i], x2 = x[i + half];
          x[i] = x1 * c - x2 * s;
          x[i + half] = x2 * c + x1 * s;
        }
    }
}

void rmsnorm_forward(Vec& out, Vec& rstd, const Vec& inp, const Vec& weight, int N, int C,
                     double eps) {
  out.assign(static_cast<size_t>(N) * C, 0.0);
  rstd.assign(N, 0.0);
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += inp[static_cast<size_t>(n) * C + c] * inp[static_cast<size_t>(n) * C + c];
    rstd[n] = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c)
      out[static_cast<size_t>(n) * C + c] =
          inp[static_cast<size_t>(n) * C + c] * rstd[n] * (weight.empty() ? 1.0 : weight[c]);
  }
}

void rmsnorm_backward(Vec& dinp, Vec& dweight, const Vec& dout, const Vec& inp,
                      const Vec& weight, const Vec& rstd, int N, int C) {
  dinp.assign(static_cast<size_t>(N) * C, 0.0);
  dweight.assign(C, 0.0);
  for (int n = 0; n < N; ++n) {
    const double* x = &inp[static_cast<size_t>(n) * C];
    const double* g = &dout[static_cast<size_t>(n) * C];
    const double r = rstd[n];
    double wgx = 0;
    for (int c = 0; c < C; ++c) wgx += (weight.empty() ? 1.0 : weight[c]) * g[c] * x[c];
    for (int c = 0; c < C; ++c) {
      const double w = weight.empty() ? 1.0 : weight[c];
      dinp[static_cast<size_t>(n) * C + c] = r * (w * g[c] - x[c] * r * r * wgx / C);
      dweight[c] += g[c] * x[c] * r;
    }
  }
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }
double silu_grad(double x) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s * (1.0 + x * (1.0 - s));
}

double gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double gelu_grad(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double u = k * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  const double du = k * (1.0 + 3.0 * 0.044715 * x * x);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
}

Vec cross_entropy(const Vec& logits, const std::vector<int32_t>& targets, int N, int V, int Vp,
                  int ignore_index, double grad_scale, Vec* dlogits) {
  Vec losses(N, 0.0);
  if (dlogits) dlogits->assign(static_cast<size_t>(N) * Vp, 0.0);
  for (int n = 0; n < N; ++n) {
    if (targets[n] == ignore_index) continue;
    const double* x = &logits[static_cast<size_t>(n) * Vp];
    double mx = -std::numeric_limits<double>::infinity();
    for (int v = 0; v < V; ++v) mx = std::max(mx, x[v]);
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(x[v] - mx);
    const double lse = mx + std::log(sum);
    losses[n] = lse - x[targets[n]];
    if (dlogits) {
      for (int v = 0; v < V; ++v)
        (*dlogits)[static_cast<size_t>(n) * Vp + v] =
            grad_scale * (std::exp(x[v] - lse) - (v == targets[n] ? 1.0 : 0.0));
    }
  }
  return losses;
}

void adamw_step(Vec& param, const Vec& grad, Vec& m, Vec& v, const AdamW& hp) {
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  for (size_t i = 0; i < param.size(); ++i) {
    const double g = grad[i] * hp.grad_scale;
    m[i] = hp.beta1 * m[i] + (1.0 - hp.beta1) * g;
    v[i] = hp.beta2 * v[i] + (1.0 - hp.beta2) * g * g;
    const double mhat = m[i] / bc1, vhat = v[i] / bc2;
    param[i] -= hp.lr * (mhat / (std::sqrt(vhat) + hp.eps) + hp.weight_decay * param[i]);
  }
}

Vec moe_scores(const Vec& logits, int N, int E, bool sigmoid) {
  Vec s(logits.size());
  for (int n = 0; n < N; ++n) {
    const double* l = logits.data() + static_cast<size_t>(n) * E;
    double* o = s.data() + static_cast<size_t>(n) * E;
    if (sigmoid) {
      for (int e = 0; e < E; ++e) o[e] = 1.0 / (1.0 + std::exp(-l[e]));
      continue;
    }
    double mx = l[0], sum = 0;
    for (int e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    for (int e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
    for (int e = 0; e < E; ++e) o[e] = std::exp(l[e] - mx) / sum;
  }
  return s;
}

std::vector<int32_t> moe_top_k(const Vec& key, int N, int E, int k) {
  std::vector<int32_t> idx;
  for (int n = 0; n < N; ++n) {
    std::vector<int32_t> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) order[e] = e;
    const double* r = key.data() + static_cast<size_t>(n) * E;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return r[a] > r[b]; });
    idx.insert(idx.end(), order.begin(), order.begin() + k);
  }
  return idx;
}

Vec moe_weights(const Vec& scores, const std::vector<int32_t>& idx, int N, int E, int k,
                bool renormalize) {
  Vec w(static_cast<size_t>(N) * k);
  for (int n = 0; n < N; ++n) {
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += w[n * k + j] = scores[static_cast<size_t>(n) * E + idx[n * k + j]];
    if (renormalize)
      for (int j = 0; j < k; ++j) w[n * k + j] /= sum + 1e-20;
  }
  return w;
}

Vec moe_router_backward(const Vec& dweight, const Vec& dscores, const Vec& scores,
                        const std::vector<int32_t>& idx, int N, int E, int k, bool sigmoid,
                        bool renormalize) {
  Vec dl(static_cast<size_t>(N) * E);
  for (int n = 0; n < N; ++n) {
    const double* s = scores.data() + static_cast<size_t>(n) * E;
    Vec ds(static_cast<size_t>(E), 0.0);
    if (!dscores.empty())
      for (int e = 0; e < E; ++e) ds[e] = dscores[static_cast<size_t>(n) * E + e];
    double S = 1e-20;
    for (int j = 0; j < k; ++j) S += s[idx[n * k + j]];
    // d w_j / d s_{i_l} = [j == l] / S - s_{i_j} / S^2 (renormalised), else [j == l].
    for (int l = 0; l < k; ++l)
      for (int j = 0; j < k; ++j) {
        const double jac = renormalize ? (j == l ? 1.0 / S : 0.0) - s[idx[n * k + j]] / (S * S)
                                       : (j == l ? 1.0 : 0.0);
        ds[idx[n * k + l]] += dweight[n * k + j] * jac;
      }
    // d s_e / d l_f = s_e ([e == f] - s_f) (softmax), or s_e (1 - s_e) [e == f] (sigmoid).
    for (int f = 0; f < E; ++f) {
      double g = 0;
      for (int e = 0; e < E; ++e)
        g += ds[e] * (sigmoid ? (e == f ? s[e] * (1 - s[e]) : 0.0) : s[e] * ((e == f) - s[f]));
      dl[static_cast<size_t>(n) * E + f] = g;
    }
  }
  return dl;
}

void moe_plan(std::vector<int32_t>& offsets, std::vector<int32_t>& rows,
              const std::vector<int32_t>& idx, int N, int k, int E, int capacity) {
  const int M = N * k, cap = capacity > 0 ? capacity : M;
  offsets.assign(static_cast<size_t>(E) + 1, 0);
  for (int e = 0; e <= E; ++e)
    for (int f = 0; f < e; ++f) {
      int count = 0;
      for (int i = 0; i < M; ++i) count += idx[i] == f;
      offsets[e] += std::min(count, cap);
    }
  rows.assign(static_cast<size_t>(M), 0);
  for (int i = 0; i < M; ++i) {
    int rank = 0;
    for (int i2 = 0; i2 < i; ++i2) rank += idx[i2] == idx[i];
    rows[i] = rank < cap ? offsets[idx[i]] + rank : -1;
  }
}

}  // namespace kiln::ref

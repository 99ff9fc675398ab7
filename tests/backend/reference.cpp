#include "reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln::ref {

Vec embedding_forward(const std::vector<int32_t>& tokens, const Vec& wte, const Vec& wpe, int B,
                      int T, int C) {
  Vec out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int64_t tok = tokens[b * T + t];
      for (int c = 0; c < C; ++c)
        out[(static_cast<size_t>(b) * T + t) * C + c] = wte[tok * C + c] + wpe[t * C + c];
    }
  return out;
}

void embedding_backward(Vec& dwte, Vec& dwpe, const Vec& dout, const std::vector<int32_t>& tokens,
                        int B, int T, int C, int Vp, int maxT) {
  dwte.assign(static_cast<size_t>(Vp) * C, 0.0);
  dwpe.assign(static_cast<size_t>(maxT) * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int64_t tok = tokens[b * T + t];
      for (int c = 0; c < C; ++c) {
        const double g = dout[(static_cast<size_t>(b) * T + t) * C + c];
        dwte[tok * C + c] += g;
        dwpe[t * C + c] += g;
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
  int T, C, NH, HD;
  // qkv [B,T,3C]: q at 0, k at C, v at 2C; head h at h*HD.
  size_t q(int b, int t, int h) const { return (static_cast<size_t>(b) * T + t) * 3 * C + h * HD; }
  size_t k(int b, int t, int h) const { return q(b, t, h) + C; }
  size_t v(int b, int t, int h) const { return q(b, t, h) + 2 * C; }
  size_t o(int b, int t, int h) const { return (static_cast<size_t>(b) * T + t) * C + h * HD; }
  size_t m(int b, int h, int t, int j) const {
    return ((static_cast<size_t>(b) * NH + h) * T + t) * T + j;
  }
};

// Probabilities P[t][j] (j <= t) and lse of row t, for (b, h).
void attn_probs(const Vec& qkv, const AttnIdx& ix, int b, int h, int t, Vec& P, double& lse) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(ix.HD));
  P.assign(t + 1, 0.0);
  double mx = -std::numeric_limits<double>::infinity();
  for (int j = 0; j <= t; ++j) {
    double s = 0;
    for (int d = 0; d < ix.HD; ++d) s += qkv[ix.q(b, t, h) + d] * qkv[ix.k(b, j, h) + d];
    P[j] = s * scale;
    mx = std::max(mx, P[j]);
  }
  double sum = 0;
  for (int j = 0; j <= t; ++j) sum += std::exp(P[j] - mx);
  lse = mx + std::log(sum);
  for (int j = 0; j <= t; ++j) P[j] = std::exp(P[j] - lse);
}
}  // namespace

void attention_forward(Vec& out, Vec& lse, const Vec& qkv, int B, int T, int C, int NH,
                       const std::vector<uint8_t>& keep, double p) {
  const AttnIdx ix{T, C, NH, C / NH};
  out.assign(static_cast<size_t>(B) * T * C, 0.0);
  lse.assign(static_cast<size_t>(B) * NH * T, 0.0);
  Vec P;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double l;
        attn_probs(qkv, ix, b, h, t, P, l);
        lse[(static_cast<size_t>(b) * NH + h) * T + t] = l;
        for (int j = 0; j <= t; ++j) {
          const double pd = keep.empty() ? P[j] : P[j] * keep[ix.m(b, h, t, j)] / (1.0 - p);
          for (int d = 0; d < ix.HD; ++d) out[ix.o(b, t, h) + d] += pd * qkv[ix.v(b, j, h) + d];
        }
      }
}

Vec attention_backward(const Vec& dout, const Vec& qkv, int B, int T, int C, int NH,
                       const std::vector<uint8_t>& keep, double p) {
  const AttnIdx ix{T, C, NH, C / NH};
  const double scale = 1.0 / std::sqrt(static_cast<double>(ix.HD));
  Vec dqkv(qkv.size(), 0.0);
  Vec P, dP;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double l;
        attn_probs(qkv, ix, b, h, t, P, l);
        dP.assign(t + 1, 0.0);
        double D = 0;
        for (int j = 0; j <= t; ++j) {
          const double mult = keep.empty() ? 1.0 : keep[ix.m(b, h, t, j)] / (1.0 - p);
          double dpd = 0;  // d out_t / d Pdrop_j . dout_t
          for (int d = 0; d < ix.HD; ++d) {
            dpd += dout[ix.o(b, t, h) + d] * qkv[ix.v(b, j, h) + d];
            dqkv[ix.v(b, j, h) + d] += P[j] * mult * dout[ix.o(b, t, h) + d];
          }
          dP[j] = dpd * mult;
          D += P[j] * dP[j];
        }
        for (int j = 0; j <= t; ++j) {
          const double dS = P[j] * (dP[j] - D) * scale;
          for (int d = 0; d < ix.HD; ++d) {
            dqkv[ix.q(b, t, h) + d] += dS * qkv[ix.k(b, j, h) + d];
            dqkv[ix.k(b, j, h) + d] += dS * qkv[ix.q(b, t, h) + d];
          }
        }
      }
  return dqkv;
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

}  // namespace kiln::ref

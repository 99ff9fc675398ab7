// Self-attention: causal and bidirectional, multi-head and grouped-query, with and
// without dropout on the probabilities; and decoding over a KV cache.
//
// The interface fixes the dropout mask's source (Philox stream of the spec) but not which
// element index each probability (b, h, t, j) uses, so the tests do not assume one: they
// recover the backend's mask by running its forward with q = 0 (uniform probabilities)
// and v_j = 2^(j mod 8) in channel j / 8, which writes each row's keep bits into `out`.
// The double reference then runs with that mask. This also checks that dropped
// probabilities are exactly 0 and kept ones are scaled by exactly 1/(1-p).
#include "op_harness.h"

#include <cmath>
#include <cstring>
#include <sstream>

namespace kiln::test {
namespace {

struct AttnCfg {
  int B, T, NH, HD;
  float p;
  int NKV = 0;  // 0: NH
  bool causal = true;
  int kv() const { return NKV > 0 ? NKV : NH; }
  int C() const { return NH * HD; }             // out width
  int W() const { return (NH + 2 * kv()) * HD; }  // qkv width
  AttentionShape shape() const { return {NH, kv(), HD, causal}; }
  ref::Attn ref() const { return {B, T, NH, kv(), HD, causal}; }
  int keys(int t) const { return causal ? t + 1 : T; }
};

std::string describe(const AttnCfg& c) {
  std::ostringstream os;
  os << "B=" << c.B << " T=" << c.T << " NH=" << c.NH << " NKV=" << c.kv() << " HD=" << c.HD
     << (c.causal ? " causal" : " bidirectional") << " p=" << c.p;
  return os.str();
}

class AttentionTest : public OpTest {
 protected:
  // Recovers keep[b,h,t,j] (j <= t) from the backend's forward; needs 8 * HD >= T.
  ::testing::AssertionResult recover_mask(const AttnCfg& c, const DropoutSpec& spec,
                                          std::vector<uint8_t>& keep) {
    const int C = c.C(), W = c.W();
    std::vector<float> qkv(static_cast<size_t>(c.B) * c.T * W, 0.f);
    const std::vector<float> krand = randn(static_cast<int64_t>(qkv.size()));
    for (int b = 0; b < c.B; ++b)
      for (int t = 0; t < c.T; ++t)
        for (int g = 0; g < c.kv(); ++g)
          for (int d = 0; d < c.HD; ++d) {
            const size_t row = (static_cast<size_t>(b) * c.T + t) * W;
            const size_t k = row + (c.NH + g) * c.HD + d, v = row + (c.NH + c.kv() + g) * c.HD + d;
            qkv[k] = krand[k];  // k: anything, q = 0 makes scores 0
            qkv[v] = d == t / 8 ? static_cast<float>(1 << (t % 8)) : 0.f;
          }
    Tensor tq = upload(qkv, {c.B, c.T, W});
    Tensor out = poisoned({c.B, c.T, C}), lse = poisoned({c.B, c.NH, c.T});
    be().attention_forward(st(), out, lse, tq, c.shape(), spec);
    const std::vector<float> o = download(out);
    keep.assign(static_cast<size_t>(c.B) * c.NH * c.T * c.T, 0);
    for (int b = 0; b < c.B; ++b)
      for (int h = 0; h < c.NH; ++h)
        for (int t = 0; t < c.T; ++t)
          for (int d = 0; d < c.HD; ++d) {
            const double s = static_cast<double>(o[(static_cast<size_t>(b) * c.T + t) * C + h * c.HD + d]) *
                             c.keys(t) * (1.0 - spec.p);
            const double r = std::nearbyint(s);
            if (!(std::fabs(s - r) < 1e-2) || r < 0 || r > 255)
              return ::testing::AssertionFailure()
                     << "attention dropout: output " << s / c.keys(t) / (1.0 - spec.p)
                     << " is not a sum of kept probabilities scaled by 1/(1-p) (b=" << b
                     << " h=" << h << " t=" << t << " d=" << d << ")";
            const int bits = static_cast<int>(r);
            for (int k = 0; k < 8; ++k) {
              const int j = d * 8 + k;
              if (!((bits >> k) & 1)) continue;
              if (j >= c.keys(t))
                return ::testing::AssertionFailure() << "attention: row t=" << t << " uses key j=" << j
                                                     << " > t (not causal)";
              keep[((static_cast<size_t>(b) * c.NH + h) * c.T + t) * c.T + j] = 1;
            }
          }
    return ::testing::AssertionSuccess();
  }
};

TEST_P(AttentionTest, ForwardBackward) {
  for (const AttnCfg& c :
       {AttnCfg{1, 1, 1, 1, 0.f}, AttnCfg{1, 1, 2, 3, 0.f}, AttnCfg{2, 7, 1, 5, 0.f},
        AttnCfg{1, 13, 3, 8, 0.f}, AttnCfg{2, 33, 4, 16, 0.f}, AttnCfg{3, 64, 2, 32, 0.f},
        AttnCfg{1, 130, 1, 64, 0.f}, AttnCfg{1, 1, 1, 1, 0.2f}, AttnCfg{2, 9, 3, 4, 0.1f},
        AttnCfg{1, 16, 2, 8, 0.3f}, AttnCfg{2, 33, 2, 5, 0.5f},
        // grouped-query (NKV < NH), bidirectional, and both, with and without dropout
        AttnCfg{1, 5, 2, 3, 0.f, 1}, AttnCfg{2, 19, 4, 8, 0.f, 2}, AttnCfg{1, 40, 6, 16, 0.f, 3},
        AttnCfg{2, 9, 4, 4, 0.2f, 1}, AttnCfg{1, 1, 1, 1, 0.f, 0, false},
        AttnCfg{2, 11, 3, 5, 0.f, 0, false}, AttnCfg{1, 70, 2, 32, 0.f, 0, false},
        AttnCfg{2, 13, 4, 8, 0.25f, 0, false}, AttnCfg{1, 21, 6, 4, 0.f, 2, false},
        AttnCfg{2, 16, 4, 2, 0.1f, 2, false}}) {
    const std::string what = describe(c);
    const int C = c.C(), W = c.W();
    const DropoutSpec spec{c.p, rng()(), rng()() % 100};
    std::vector<uint8_t> keep;
    if (spec.enabled()) {
      ASSERT_TRUE(recover_mask(c, spec, keep)) << what;
      if (c.B * c.NH * c.T * (c.T + 1) / 2 >= 500) {
        int64_t kept = 0, total = 0;
        for (int b = 0; b < c.B; ++b)
          for (int h = 0; h < c.NH; ++h)
            for (int t = 0; t < c.T; ++t)
              for (int j = 0; j < c.keys(t); ++j, ++total)
                kept += keep[((static_cast<size_t>(b) * c.NH + h) * c.T + t) * c.T + j];
        const double rate = static_cast<double>(kept) / total;
        EXPECT_NEAR(rate, 1.0 - c.p, 6 * std::sqrt(c.p * (1 - c.p) / total)) << "keep rate; " << what;
      }
    }
    const int64_t nqkv = int64_t{c.B} * c.T * W;
    const std::vector<float> qkv = randn(nqkv, 1.3f);
    Tensor tq = upload(qkv, {c.B, c.T, W});
    Tensor out = poisoned({c.B, c.T, C}), lse = poisoned({c.B, c.NH, c.T});
    be().attention_forward(st(), out, lse, tq, c.shape(), spec);
    Vec rout, rlse;
    ref::attention_forward(rout, rlse, to_double(qkv), c.ref(), keep, c.p);
    const std::vector<float> got_out = download(out);
    EXPECT_TRUE(near_by_norm(spec.enabled() ? "attention_forward out (dropout)" : "attention_forward out",
                             got_out, rout, 1e-5)) << what;
    EXPECT_TRUE(near_by_norm("attention_forward lse", download(lse), rlse, 1e-5)) << what;

    if (spec.enabled()) {
      // Replay: the same spec, the same output, bit for bit.
      Tensor out2 = poisoned({c.B, c.T, C}), lse2 = poisoned({c.B, c.NH, c.T});
      be().attention_forward(st(), out2, lse2, tq, c.shape(), spec);
      EXPECT_TRUE(bitwise_equal("attention_forward dropout replay", download(out2), got_out)) << what;
      if (c.T >= 9) {
        be().attention_forward(st(), out2, lse2, tq, c.shape(), DropoutSpec{c.p, spec.seed ^ 0x5555, spec.stream});
        EXPECT_FALSE(bitwise_equal("other seed", download(out2), got_out)) << "mask ignores the seed; " << what;
      }
    }

    // Backward from the reference's out and lse (so that it is tested on its own).
    const std::vector<float> dout = randn(int64_t{c.B} * c.T * C);
    Tensor dqkv = poisoned({c.B, c.T, W});
    be().attention_backward(st(), dqkv, upload(dout, {c.B, c.T, C}), tq,
                            upload(to_float(rout), {c.B, c.T, C}),
                            upload(to_float(rlse), {c.B, c.NH, c.T}), c.shape(), spec);
    const Vec rd = ref::attention_backward(to_double(dout), to_double(qkv), c.ref(), keep, c.p);
    const std::vector<float> got_d = download(dqkv);
    EXPECT_TRUE(near_by_norm(spec.enabled() ? "attention_backward dqkv (dropout)" : "attention_backward dqkv",
                             got_d, rd, 1e-5)) << what;

    const Forward f = [&](const Inputs& in) {
      Vec o, l;
      ref::attention_forward(o, l, in[0], c.ref(), keep, c.p);
      return o;
    };
    EXPECT_TRUE(check_fd("attention_backward dqkv", f, {to_double(qkv)}, to_double(dout), 0, rd,
                         to_double(got_d), rng(), 12)) << what;

    if (spec.enabled()) {
      // Mask-agnostic: central differences of the backend's own fp32 forward with the
      // same spec (h = 1e-2; loose bound for fp32 noise and truncation).
      auto backend_loss = [&](const std::vector<float>& x) {
        Tensor o = poisoned({c.B, c.T, C}), l = poisoned({c.B, c.NH, c.T});
        be().attention_forward(st(), o, l, upload(x, {c.B, c.T, W}), c.shape(), spec);
        const std::vector<float> y = download(o);
        double L = 0;
        for (size_t i = 0; i < y.size(); ++i) L += static_cast<double>(dout[i]) * y[i];
        return L;
      };
      double s = 0;
      for (double g : rd) s += g * g;
      s = std::sqrt(s / rd.size());
      std::vector<float> x = qkv;
      for (int k = 0; k < 12; ++k) {
        const size_t i = std::uniform_int_distribution<size_t>(0, x.size() - 1)(rng());
        const float x0 = x[i];
        x[i] = x0 + 1e-2f;
        const float xp = x[i];
        const double lp = backend_loss(x);
        x[i] = x0 - 1e-2f;
        const float xm = x[i];
        const double lm = backend_loss(x);
        x[i] = x0;
        const double fd = (lp - lm) / (static_cast<double>(xp) - xm);
        EXPECT_LE(std::fabs(got_d[i] - fd), 1e-2 * (std::fabs(fd) + s))
            << "attention_backward (dropout) vs central difference of the backend forward at qkv["
            << i << "]: " << got_d[i] << " vs " << fd << "; " << what;
      }
    }
  }
}

// attention_decode: k/v of the new tokens go into cache rows past.., rows beyond stay
// untouched, and out equals causal attention over the whole sequence (reference run on
// [cache rows 0..past) ++ new tokens], keeping the last Tq rows).
TEST_P(AttentionTest, Decode) {
  struct Cfg { int B, Tq, past, Tmax, NH, HD, NKV = 0; };
  for (const Cfg& c : {Cfg{1, 1, 0, 1, 1, 1}, Cfg{2, 1, 5, 9, 3, 4}, Cfg{1, 4, 3, 16, 2, 8},
                       Cfg{2, 7, 0, 7, 1, 5}, Cfg{3, 1, 63, 64, 4, 16}, Cfg{1, 13, 20, 40, 3, 7},
                       Cfg{2, 3, 6, 12, 4, 8, 2}, Cfg{1, 1, 9, 10, 6, 4, 1}}) {
    const int NKV = c.NKV > 0 ? c.NKV : c.NH;
    std::ostringstream os;
    os << "B=" << c.B << " Tq=" << c.Tq << " past=" << c.past << " Tmax=" << c.Tmax
       << " NH=" << c.NH << " NKV=" << NKV << " HD=" << c.HD;
    const std::string what = os.str();
    const int C = c.NH * c.HD, KV = NKV * c.HD, W = C + 2 * KV, T = c.past + c.Tq;
    const AttentionShape shape{c.NH, NKV, c.HD, true};
    const std::vector<float> kc0 = randn(int64_t{c.B} * c.Tmax * KV), vc0 = randn(int64_t{c.B} * c.Tmax * KV);
    const std::vector<float> qkv = randn(int64_t{c.B} * c.Tq * W, 1.3f);
    Tensor kc = upload(kc0, {c.B, c.Tmax, KV}), vc = upload(vc0, {c.B, c.Tmax, KV});
    Tensor out = poisoned({c.B, c.Tq, C});
    Tensor tq = upload(qkv, {c.B, c.Tq, W});
    be().attention_decode(st(), out, kc, vc, tq, c.past, shape);

    // Expected caches and the full sequence for the reference.
    std::vector<float> kwant = kc0, vwant = vc0;
    Vec full(static_cast<size_t>(c.B) * T * W, 0.0);
    for (int b = 0; b < c.B; ++b)
      for (int t = 0; t < T; ++t) {
        const size_t f = (static_cast<size_t>(b) * T + t) * W;
        for (int i = 0; i < KV; ++i) {
          const size_t cache = (static_cast<size_t>(b) * c.Tmax + t) * KV + i;
          if (t < c.past) {
            full[f + C + i] = kc0[cache];
            full[f + C + KV + i] = vc0[cache];
          } else {
            const size_t q = (static_cast<size_t>(b) * c.Tq + (t - c.past)) * W;
            full[f + C + i] = qkv[q + C + i];
            full[f + C + KV + i] = qkv[q + C + KV + i];
            kwant[cache] = qkv[q + C + i];
            vwant[cache] = qkv[q + C + KV + i];
          }
        }
        if (t >= c.past)
          for (int i = 0; i < C; ++i)
            full[f + i] = qkv[(static_cast<size_t>(b) * c.Tq + (t - c.past)) * W + i];
      }
    EXPECT_TRUE(bitwise_equal("attention_decode k_cache", download(kc), kwant)) << what;
    EXPECT_TRUE(bitwise_equal("attention_decode v_cache", download(vc), vwant)) << what;
    Vec rout, rlse;
    ref::attention_forward(rout, rlse, full, ref::Attn{c.B, T, c.NH, NKV, c.HD, true}, {}, 0.0);
    Vec want(static_cast<size_t>(c.B) * c.Tq * C);
    for (int b = 0; b < c.B; ++b)
      for (int t = 0; t < c.Tq; ++t)
        for (int i = 0; i < C; ++i)
          want[(static_cast<size_t>(b) * c.Tq + t) * C + i] =
              rout[(static_cast<size_t>(b) * T + c.past + t) * C + i];
    EXPECT_TRUE(near_by_norm("attention_decode out", download(out), want, 1e-5)) << what;

    // Past the end of the cache, or a bidirectional shape: an error, not a bad write.
    Tensor out2 = poisoned({c.B, c.Tq, C});
    EXPECT_THROW(be().attention_decode(st(), out2, kc, vc, tq, c.Tmax - c.Tq + 1, shape), Error) << what;
    EXPECT_THROW(be().attention_decode(st(), out2, kc, vc, tq, 0, AttentionShape{c.NH, NKV, c.HD, false}),
                 Error) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionTest, ::testing::ValuesIn(backend_names()),
                         param_name);

}  // namespace
}  // namespace kiln::test

// Embedding, layernorm, linear, softmax cross-entropy, AdamW and the weights' EMA.
#include "op_harness.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace kiln::test {
namespace {

// ---- embedding --------------------------------------------------------------------------

TEST_P(OpTest, Embedding) {
  struct Cfg { int B, T, C, Vp, maxT; };
  for (const Cfg& c : {Cfg{1, 1, 1, 5, 1}, Cfg{2, 7, 13, 37, 9}, Cfg{1, 17, 33, 50, 20},
                       Cfg{4, 64, 96, 301, 64}, Cfg{3, 5, 8, 4, 1024}}) {
    const std::string what = sizes({{"B", c.B}, {"T", c.T}, {"C", c.C}, {"Vp", c.Vp}, {"maxT", c.maxT}});
    const int N = c.B * c.T;
    std::vector<int32_t> tok(N);
    for (int i = 0; i < N; ++i)  // half from a tiny subset: repeated tokens collide in dwte
      tok[i] = i % 2 ? randint(0, c.Vp - 1) : randint(0, std::min(2, c.Vp - 1));
    tok[N - 1] = c.Vp - 1;  // the last (padded) row is a valid index
    const std::vector<float> wte = randn(int64_t{c.Vp} * c.C), wpe = randn(int64_t{c.maxT} * c.C);
    Tensor ttok = upload_i32(tok, {c.B, c.T});
    Tensor twte = upload(wte, {c.Vp, c.C}, MemCategory::Parameters);
    Tensor twpe = upload(wpe, {c.maxT, c.C}, MemCategory::Parameters);
    Tensor out = poisoned({c.B, c.T, c.C});
    be().embedding_forward(st(), out, ttok, Tensor(), twte, twpe);
    const Vec want = ref::embedding_forward(tok, to_double(wte), to_double(wpe), c.B, c.T, c.C);
    EXPECT_TRUE(near_by_norm("embedding_forward", download(out), want, 1e-6)) << what;

    // Backward accumulates into pre-filled dwte/dwpe.
    const std::vector<float> dout = randn(int64_t{N} * c.C);
    const std::vector<float> dwte0 = randn(int64_t{c.Vp} * c.C), dwpe0 = randn(int64_t{c.maxT} * c.C);
    Tensor dwte = upload(dwte0, {c.Vp, c.C}, MemCategory::Gradients);
    Tensor dwpe = upload(dwpe0, {c.maxT, c.C}, MemCategory::Gradients);
    be().embedding_backward(st(), dwte, dwpe, upload(dout, {c.B, c.T, c.C}), ttok, Tensor());
    Vec gwte, gwpe;
    ref::embedding_backward(gwte, gwpe, to_double(dout), tok, c.B, c.T, c.C, c.Vp, c.maxT);
    const std::vector<float> got_wte = download(dwte), got_wpe = download(dwpe);
    EXPECT_TRUE(near_by_norm("embedding_backward dwte (+=)", got_wte,
                             [&] { Vec v = gwte; for (size_t i = 0; i < v.size(); ++i) v[i] += dwte0[i]; return v; }(),
                             1e-6)) << what;
    EXPECT_TRUE(near_by_norm("embedding_backward dwte", to_float(minus(got_wte, dwte0)), gwte, 1e-5,
                             accumulated_min_norm(dwte0, 1e-5))) << what;
    EXPECT_TRUE(near_by_norm("embedding_backward dwpe", to_float(minus(got_wpe, dwpe0)), gwpe, 1e-5,
                             accumulated_min_norm(dwpe0, 1e-5))) << what;
    // Rows t >= T of dwpe are not touched.
    for (int64_t i = int64_t{c.T} * c.C; i < int64_t{c.maxT} * c.C; ++i)
      ASSERT_EQ(got_wpe[i], dwpe0[i]) << "dwpe element " << i << " beyond T changed; " << what;

    const Forward f = [&](const Inputs& in) {
      return ref::embedding_forward(tok, in[0], in[1], c.B, c.T, c.C);
    };
    const Inputs x = {to_double(wte), to_double(wpe)};
    EXPECT_TRUE(check_fd("embedding_backward dwte", f, x, to_double(dout), 0, gwte, minus(got_wte, dwte0), rng())) << what;
    EXPECT_TRUE(check_fd("embedding_backward dwpe", f, x, to_double(dout), 1, gwpe, minus(got_wpe, dwpe0), rng())) << what;
  }
}

// ---- layernorm --------------------------------------------------------------------------

TEST_P(OpTest, LayerNorm) {
  struct Cfg { int N, C; };
  const float eps = 1e-5f;
  for (const Cfg& c : {Cfg{1, 1}, Cfg{1, 7}, Cfg{5, 33}, Cfg{13, 64}, Cfg{64, 769}, Cfg{3, 1600}}) {
    const std::string what = sizes({{"N", c.N}, {"C", c.C}});
    const int64_t NC = int64_t{c.N} * c.C;
    std::vector<float> x = randn(NC);
    for (int n = 0; n < c.N; ++n) {  // per-row offset and scale, like a residual stream
      const float off = randu(1, -2.f, 2.f)[0], sc = randu(1, 0.5f, 3.f)[0];
      for (int i = 0; i < c.C; ++i) x[int64_t{n} * c.C + i] = off + sc * x[int64_t{n} * c.C + i];
    }
    const std::vector<float> w = randn(c.C, 0.5f, 1.f), bias = randn(c.C, 0.2f);
    Tensor tx = upload(x, {c.N, c.C}), tw = upload(w, {c.C}, MemCategory::Parameters),
           tb = upload(bias, {c.C}, MemCategory::Parameters);
    Tensor out = poisoned({c.N, c.C}), mean = poisoned({c.N}), rstd = poisoned({c.N});
    be().layernorm_forward(st(), out, mean, rstd, tx, tw, tb, eps);
    Vec rout, rmean, rrstd;
    ref::layernorm_forward(rout, rmean, rrstd, to_double(x), to_double(w), to_double(bias), c.N, c.C, eps);
    EXPECT_TRUE(near_by_norm("layernorm_forward out", download(out), rout, 1e-5)) << what;
    EXPECT_TRUE(near_by_norm("layernorm_forward mean", download(mean), rmean, 1e-5)) << what;
    EXPECT_TRUE(near_by_norm("layernorm_forward rstd", download(rstd), rrstd, 1e-5)) << what;

    // Backward: dinp, dweight and dbias all accumulate.
    const std::vector<float> dout = randn(NC);
    const std::vector<float> dinp0 = randn(NC), dw0 = randn(c.C), db0 = randn(c.C);
    Tensor dinp = upload(dinp0, {c.N, c.C}), dw = upload(dw0, {c.C}, MemCategory::Gradients),
           db = upload(db0, {c.C}, MemCategory::Gradients);
    be().layernorm_backward(st(), dinp, dw, db, upload(dout, {c.N, c.C}), tx, tw,
                            upload(to_float(rmean), {c.N}), upload(to_float(rrstd), {c.N}));
    Vec gx, gw, gb;
    ref::layernorm_backward(gx, gw, gb, to_double(dout), to_double(x), to_double(w), rmean, rrstd, c.N, c.C);
    const std::vector<float> got_x = download(dinp), got_w = download(dw), got_b = download(db);
    // dinp's natural size is ||rstd * dout * w||: at C = 1 the exact dinp is 0 while its
    // fp32 rounding is amplified by rstd = 1/sqrt(eps).
    double dx_scale = 0;
    for (int n = 0; n < c.N; ++n)
      for (int i = 0; i < c.C; ++i) {
        const double t = rrstd[n] * dout[int64_t{n} * c.C + i] * w[i];
        dx_scale += t * t;
      }
    dx_scale = std::sqrt(dx_scale);
    EXPECT_TRUE(near_by_norm("layernorm_backward dinp (+=)", to_float(minus(got_x, dinp0)), gx, 1e-5,
                             std::max(dx_scale, accumulated_min_norm(dinp0, 1e-5)))) << what;
    EXPECT_TRUE(near_by_norm("layernorm_backward dweight (+=)", to_float(minus(got_w, dw0)), gw, 1e-5,
                             accumulated_min_norm(dw0, 1e-5))) << what;
    EXPECT_TRUE(near_by_norm("layernorm_backward dbias (+=)", to_float(minus(got_b, db0)), gb, 1e-5,
                             accumulated_min_norm(db0, 1e-5))) << what;

    const Forward f = [&](const Inputs& in) {
      Vec o, m, r;
      ref::layernorm_forward(o, m, r, in[0], in[1], in[2], c.N, c.C, eps);
      return o;
    };
    const Inputs in = {to_double(x), to_double(w), to_double(bias)};
    EXPECT_TRUE(check_fd("layernorm_backward dinp", f, in, to_double(dout), 0, gx, minus(got_x, dinp0), rng(),
                         8, 1e-4, dx_scale / std::sqrt(static_cast<double>(NC)))) << what;
    EXPECT_TRUE(check_fd("layernorm_backward dweight", f, in, to_double(dout), 1, gw, minus(got_w, dw0), rng())) << what;
    EXPECT_TRUE(check_fd("layernorm_backward dbias", f, in, to_double(dout), 2, gb, minus(got_b, db0), rng())) << what;
  }
}

// ---- linear -----------------------------------------------------------------------------

TEST_P(OpTest, Linear) {
  struct Cfg { int N, IC, OC; bool bias; double tol; };
  for (const Cfg& c : {Cfg{1, 1, 1, true, 1e-5}, Cfg{1, 7, 5, true, 1e-5}, Cfg{3, 13, 17, false, 1e-5},
                       Cfg{37, 64, 96, true, 1e-5}, Cfg{130, 257, 191, true, 1e-5},
                       Cfg{64, 768, 200, false, 1e-5}}) {
    const std::string what = sizes({{"N", c.N}, {"IC", c.IC}, {"OC", c.OC}, {"bias", c.bias}});
    const std::vector<float> x = randn(int64_t{c.N} * c.IC), w = randn(int64_t{c.OC} * c.IC, 0.2f),
                             b = c.bias ? randn(c.OC) : std::vector<float>{};
    Tensor tx = upload(x, {c.N, c.IC}), tw = upload(w, {c.OC, c.IC}, MemCategory::Parameters);
    Tensor tb = c.bias ? upload(b, {c.OC}, MemCategory::Parameters) : Tensor();
    Tensor out = poisoned({c.N, c.OC});
    be().linear_forward(st(), out, tx, tw, tb);
    const Vec want = ref::linear_forward(to_double(x), to_double(w), to_double(b), c.N, c.IC, c.OC);
    EXPECT_TRUE(near_by_norm("linear_forward", download(out), want, c.tol)) << what;

    const std::vector<float> dout = randn(int64_t{c.N} * c.OC);
    const std::vector<float> dw0 = randn(int64_t{c.OC} * c.IC, 0.1f), db0 = randn(c.OC);
    Tensor dinp = poisoned({c.N, c.IC});  // overwritten
    Tensor dw = upload(dw0, {c.OC, c.IC}, MemCategory::Gradients);
    Tensor db = c.bias ? upload(db0, {c.OC}, MemCategory::Gradients) : Tensor();
    Tensor tdout = upload(dout, {c.N, c.OC});
    be().linear_backward(st(), dinp, dw, db, tdout, tx, tw);
    Vec gx, gw, gb;
    ref::linear_backward(gx, gw, gb, to_double(dout), to_double(x), to_double(w), c.N, c.IC, c.OC);
    const std::vector<float> got_x = download(dinp), got_w = download(dw);
    EXPECT_TRUE(near_by_norm("linear_backward dinp", got_x, gx, c.tol)) << what;
    EXPECT_TRUE(near_by_norm("linear_backward dweight (+=)", to_float(minus(got_w, dw0)), gw, c.tol,
                             accumulated_min_norm(dw0, c.tol))) << what;
    std::vector<float> got_b;
    if (c.bias) {
      got_b = download(db);
      EXPECT_TRUE(near_by_norm("linear_backward dbias (+=)", to_float(minus(got_b, db0)), gb, c.tol,
                               accumulated_min_norm(db0, c.tol))) << what;
    }

    const Forward f = [&](const Inputs& in) {
      return ref::linear_forward(in[0], in[1], c.bias ? in[2] : Vec{}, c.N, c.IC, c.OC);
    };
    const Inputs in = {to_double(x), to_double(w), to_double(b)};
    EXPECT_TRUE(check_fd("linear_backward dinp", f, in, to_double(dout), 0, gx, to_double(got_x), rng())) << what;
    EXPECT_TRUE(check_fd("linear_backward dweight", f, in, to_double(dout), 1, gw, minus(got_w, dw0), rng())) << what;
    if (c.bias) {
      EXPECT_TRUE(check_fd("linear_backward dbias", f, in, to_double(dout), 2, gb, minus(got_b, db0), rng())) << what;
    }

    // dinp empty: skipped; the parameter gradients still accumulate (a second time here).
    be().linear_backward(st(), Tensor(), dw, db, tdout, tx, tw);
    const std::vector<float> got_w2 = download(dw);
    EXPECT_TRUE(near_by_norm("linear_backward dweight (dinp empty, 2nd +=)", to_float(minus(got_w2, got_w)), gw, c.tol,
                             accumulated_min_norm(got_w, c.tol))) << what;
    if (c.bias) {
      EXPECT_TRUE(near_by_norm("linear_backward dbias (dinp empty, 2nd +=)", to_float(minus(download(db), got_b)), gb, c.tol,
                               accumulated_min_norm(got_b, c.tol))) << what;
    }
  }
}

// ---- softmax cross-entropy --------------------------------------------------------------

TEST_P(OpTest, SoftmaxCrossEntropy) {
  struct Cfg { int N, V, Vp, ignore; };
  for (const Cfg& c : {Cfg{1, 1, 3, -100}, Cfg{1, 5, 8, -100}, Cfg{7, 37, 40, -1}, Cfg{2, 13, 13, -100},
                       Cfg{33, 1000, 1024, -100}, Cfg{5, 50257, 50304, -100}}) {
    const std::string what = sizes({{"N", c.N}, {"V", c.V}, {"Vp", c.Vp}, {"ignore_index", c.ignore}});
    const int64_t NV = int64_t{c.N} * c.Vp;
    std::vector<float> logits = randn(NV, 2.f);
    for (int n = 0; n < c.N; ++n)  // padding: huge values that must never enter the softmax
      for (int v = c.V; v < c.Vp; ++v) logits[int64_t{n} * c.Vp + v] = 50.f + v;
    std::vector<int32_t> tgt(c.N);
    for (int n = 0; n < c.N; ++n) tgt[n] = randint(0, c.V - 1);
    if (c.N > 1) tgt[c.N / 2] = c.ignore;           // at least one ignored row
    for (int n = 0; n < c.N; ++n)
      if (n > 0 && randint(0, 3) == 0) tgt[n] = c.ignore;
    if (c.N > 2) tgt[c.N - 1] = c.V - 1;            // the last real column
    const float grad_scale = randu(1, 0.1f, 2.f)[0];
    Vec dref;
    const Vec lref = ref::cross_entropy(to_double(logits), tgt, c.N, c.V, c.Vp, c.ignore, grad_scale, &dref);
    Tensor tl = upload(logits, {c.N, c.Vp}), tt = upload_i32(tgt, {c.N});
    // A loss is lse - logits[target]: where they nearly cancel, the floor is their rounding.
    std::vector<float> target_logits(static_cast<size_t>(c.N), 0.f);
    for (int n = 0; n < c.N; ++n)
      if (tgt[n] != c.ignore) target_logits[n] = logits[int64_t{n} * c.Vp + tgt[n]];
    const double loss_floor = accumulated_min_norm(target_logits, 1e-5);

    // Losses only (dlogits empty).
    Tensor losses = poisoned({c.N});
    be().softmax_cross_entropy(st(), losses, Tensor(), tl, tt, c.V, c.ignore, grad_scale);
    const std::vector<float> got_l = download(losses);
    EXPECT_TRUE(near_by_norm("softmax_cross_entropy losses", got_l, lref, 1e-5, loss_floor)) << what;
    for (int n = 0; n < c.N; ++n)
      if (tgt[n] == c.ignore) {
        EXPECT_EQ(got_l[n], 0.f) << "ignored row " << n << "; " << what;
      }
    EXPECT_TRUE(bitwise_equal("softmax_cross_entropy leaves logits", download(tl), logits));

    // With a separate dlogits.
    Tensor dl = poisoned({c.N, c.Vp});
    poison(losses);
    be().softmax_cross_entropy(st(), losses, dl, tl, tt, c.V, c.ignore, grad_scale);
    EXPECT_TRUE(near_by_norm("softmax_cross_entropy losses (with dlogits)", download(losses), lref, 1e-5, loss_floor)) << what;
    const std::vector<float> got_d = download(dl);
    EXPECT_TRUE(near_by_norm("softmax_cross_entropy dlogits", got_d, dref, 1e-5)) << what;
    int64_t nonzero_pad = 0;
    for (int n = 0; n < c.N; ++n)
      for (int v = 0; v < c.Vp; ++v)
        if ((v >= c.V || tgt[n] == c.ignore) && got_d[int64_t{n} * c.Vp + v] != 0.f) ++nonzero_pad;
    EXPECT_EQ(nonzero_pad, 0) << "dlogits not exactly 0 in padded columns / ignored rows; " << what;

    // dlogits aliasing logits (in place).
    be().softmax_cross_entropy(st(), losses, tl, tl, tt, c.V, c.ignore, grad_scale);
    EXPECT_TRUE(near_by_norm("softmax_cross_entropy dlogits (in place)", download(tl), dref, 1e-5)) << what;
    EXPECT_TRUE(near_by_norm("softmax_cross_entropy losses (in place)", download(losses), lref, 1e-5, loss_floor)) << what;

    // Finite differences: L = grad_scale * sum(losses) has gradient dlogits.
    if (NV <= 50000) {
      const Forward f = [&](const Inputs& in) {
        return ref::cross_entropy(in[0], tgt, c.N, c.V, c.Vp, c.ignore, 1.0, nullptr);
      };
      EXPECT_TRUE(check_fd("softmax_cross_entropy dlogits", f, {to_double(logits)}, Vec(c.N, grad_scale),
                           0, dref, to_double(got_d), rng(), 12)) << what;
    } else {  // one row's gradient only, on the big vocabulary
      const int n = 0;
      const Forward f = [&](const Inputs& in) {
        return ref::cross_entropy(in[0], {tgt[n]}, 1, c.V, c.Vp, c.ignore, 1.0, nullptr);
      };
      const Vec row(logits.begin() + int64_t{n} * c.Vp, logits.begin() + int64_t{n + 1} * c.Vp);
      const Vec drow(dref.begin() + int64_t{n} * c.Vp, dref.begin() + int64_t{n + 1} * c.Vp);
      const Vec grow(got_d.begin() + int64_t{n} * c.Vp, got_d.begin() + int64_t{n + 1} * c.Vp);
      EXPECT_TRUE(check_fd("softmax_cross_entropy dlogits", f, {row}, Vec(1, grad_scale), 0, drow, grow, rng(), 6)) << what;
    }
  }
}

// ---- adamw ------------------------------------------------------------------------------

TEST_P(OpTest, AdamW) {
  struct Cfg { int rows, cols; float wd, grad_scale; bool warm_state; };
  for (const Cfg& c : {Cfg{1, 1, 0.1f, 1.f, false}, Cfg{13, 79, 0.1f, 0.5f, false},
                       Cfg{1, 4099, 0.f, 1.f, true}, Cfg{7, 33, 0.3f, 2.f, true}}) {
    const std::string what = sizes({{"rows", c.rows}, {"cols", c.cols}}) + "wd=" + std::to_string(c.wd) +
                             " grad_scale=" + std::to_string(c.grad_scale);
    const int64_t n = int64_t{c.rows} * c.cols;
    const Shape shape{c.rows, c.cols};
    std::vector<float> p = randu(n, -1.f, 1.f);
    std::vector<float> m = c.warm_state ? randn(n, 1e-2f) : std::vector<float>(n, 0.f);
    std::vector<float> v = c.warm_state ? randu(n, 0.f, 1e-3f) : std::vector<float>(n, 0.f);
    Tensor tp = upload(p, shape, MemCategory::Parameters);
    Tensor tm = upload(m, shape, MemCategory::OptimizerState);
    Tensor tv = upload(v, shape, MemCategory::OptimizerState);
    Vec rp = to_double(p), rm = to_double(m), rv = to_double(v);
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<float> g = randn(n, 1e-2f);
      if (n > 3) g[1] = 0.f;
      AdamWParams hp;
      hp.lr = 0.05f;
      hp.beta1 = 0.9f;
      hp.beta2 = 0.95f;
      hp.eps = 1e-8f;
      hp.weight_decay = c.wd;
      hp.grad_scale = c.grad_scale;
      hp.step = step;
      Tensor tg = upload(g, shape, MemCategory::Gradients);
      const std::vector<float> p_before = download(tp);
      // The moments' natural size: their two terms, beta m and (1 - beta) g (g^2), so that a
      // new moment that nearly cancels (one element, a gradient against the old moment)
      // is held to fp32 rounding of the terms, not of the small difference.
      double m_terms = 0.0, v_terms = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const double gi = double{g[i]} * c.grad_scale;
        m_terms += std::pow(hp.beta1 * std::fabs(rm[i]) + (1.0 - hp.beta1) * std::fabs(gi), 2);
        v_terms += std::pow(hp.beta2 * std::fabs(rv[i]) + (1.0 - hp.beta2) * gi * gi, 2);
      }
      be().adamw_step(st(), tp, tg, tm, tv, Tensor(), hp);
      ref::adamw_step(rp, to_double(g), rm, rv,
                      {hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.grad_scale, hp.step});
      const std::string at = what + " step " + std::to_string(step);
      const std::vector<float> gp = download(tp);
      EXPECT_TRUE(near_by_norm("adamw_step param", gp, rp, 1e-5)) << at;
      EXPECT_TRUE(near_by_norm("adamw_step m", download(tm), rm, 1e-5, std::sqrt(m_terms))) << at;
      EXPECT_TRUE(near_by_norm("adamw_step v", download(tv), rv, 1e-5, std::sqrt(v_terms))) << at;
      // The update itself, relative to the size of its two terms (the Adam step and the
      // weight decay, which can nearly cancel for one element), allowing for the fp32
      // rounding of the parameter (half an ulp of |p|, large next to a tiny update).
      Vec upd(n);
      double terms_sq = 0.0, round_sq = 0.0;
      const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(step));
      const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(step));
      for (int64_t i = 0; i < n; ++i) {
        upd[i] = rp[i] - p_before[i];
        const float a = std::fabs(gp[i]);
        const double half_ulp = 0.5 * (std::nextafter(a, INFINITY) - a);
        const double adam = hp.lr * std::fabs(rm[i] / bc1) / (std::sqrt(rv[i] / bc2) + hp.eps);
        const double decay = double{hp.lr} * c.wd * std::fabs(p_before[i]);
        terms_sq += (adam + decay) * (adam + decay);
        round_sq += half_ulp * half_ulp;
      }
      const double terms = std::sqrt(terms_sq);
      const double upd_tol = 1e-4 + (terms > 0 ? std::sqrt(round_sq) / terms : 0.0);
      EXPECT_TRUE(near_by_norm("adamw_step update", to_float(minus(gp, p_before)), upd, upd_tol,
                               terms)) << at;
      EXPECT_TRUE(bitwise_equal("adamw_step leaves grad", download(tg), g)) << at;
      // Continue from the backend's state so that the reference tracks the same inputs.
      rp = to_double(gp);
      rm = to_double(download(tm));
      rv = to_double(download(tv));
    }
  }
}

// Bias corrections in double, as torch.optim.AdamW: beta2 = 0.999 at step 6 with warm
// moments. With fp32 betas the corrections were 1.3e-5 off (the update ~6e-6).
TEST_P(OpTest, AdamWBiasCorrectionsInDouble) {
  const int64_t n = 257;
  const Shape shape{n};
  // p = 0 so that the fp32 parameter holds the update itself, unrounded by |p|.
  std::vector<float> p(n, 0.f), m = randn(n, 1e-2f), v = randu(n, 1e-4f, 1e-3f);
  const std::vector<float> g = randn(n, 1e-3f);
  Tensor tp = upload(p, shape, MemCategory::Parameters);
  Tensor tm = upload(m, shape, MemCategory::OptimizerState);
  Tensor tv = upload(v, shape, MemCategory::OptimizerState);
  AdamWParams hp;
  hp.lr = 1e-3f;
  hp.beta1 = 0.9;
  hp.beta2 = 0.999;
  hp.eps = 1e-8f;
  hp.step = 6;
  be().adamw_step(st(), tp, upload(g, shape, MemCategory::Gradients), tm, tv, Tensor(), hp);
  Vec rp = to_double(p), rm = to_double(m), rv = to_double(v);
  ref::adamw_step(rp, to_double(g), rm, rv,
                  {hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.grad_scale, hp.step});
  const std::vector<float> gp = download(tp);
  Vec upd(n);
  for (int64_t i = 0; i < n; ++i) upd[i] = rp[i] - p[i];
  EXPECT_TRUE(near_by_norm("adamw_step update at step 6, beta2 0.999", to_float(minus(gp, p)), upd, 1e-6));
}

// adamw_multi_step against the per-tensor calls it replaces (adamw_step on the master or
// the parameter, then the master's copy to the parameter), bitwise: 47 tensors (more than
// one CUDA launch takes) of awkward sizes, some longer than a block's chunk, mixing fp32
// parameters, bf16 parameters with fp32 masters, bf16 gradients, weight decay on and off,
// and a device scale; then a non-finite scale, which must change nothing.
TEST_P(OpTest, AdamWMultiTensorMatchesPerTensor) {
  struct Spec { int64_t n; bool bf16, bf16_grad; float wd; };
  std::vector<Spec> specs;
  for (int i = 0; i < 45; ++i)
    specs.push_back({i % 7 == 3 ? 1 : 1 + (i * 977) % 5003, i % 3 != 0, i % 3 == 1, i % 2 ? 0.1f : 0.f});
  specs.push_back({9001, true, false, 0.1f});
  specs.push_back({8192, false, false, 0.f});
  struct Copy { std::vector<AdamWTensor> t; };
  Copy a, b;
  for (const Spec& s : specs) {
    const std::vector<float> p = randu(s.n, -1.f, 1.f), m = randn(s.n, 1e-2f),
                             v = randu(s.n, 0.f, 1e-3f);
    for (Copy* c : {&a, &b}) {
      AdamWTensor t;
      t.param = be().empty(Shape{s.n}, s.bf16 ? DType::BF16 : DType::F32, MemCategory::Parameters);
      upload_f32(be(), t.param, p.data());
      if (s.bf16) {
        t.master = be().empty(Shape{s.n}, DType::F32, MemCategory::OptimizerState);
        be().copy(st(), t.master, t.param);
      }
      t.grad = be().empty(Shape{s.n}, s.bf16_grad ? DType::BF16 : DType::F32, MemCategory::Gradients);
      t.m = upload(m, {s.n}, MemCategory::OptimizerState);
      t.v = upload(v, {s.n}, MemCategory::OptimizerState);
      t.weight_decay = s.wd;
      c->t.push_back(t);
    }
  }
  auto state = [&](const Copy& c) {
    std::vector<float> all;
    for (const AdamWTensor& t : c.t)
      for (const Tensor& x : {t.param, t.master, t.m, t.v})
        if (x) {
          const std::vector<float> h = download_f32(be(), x);
          all.insert(all.end(), h.begin(), h.end());
        }
    return all;
  };
  Tensor scale = upload({0.7f}, {1}, MemCategory::OptimizerState);
  for (int64_t step = 1; step <= 3; ++step) {
    AdamWParams hp;
    hp.lr = 0.05f;
    hp.beta1 = 0.9;
    hp.beta2 = 0.95;
    hp.grad_scale = step == 2 ? 0.5f : 1.f;
    hp.step = step;
    for (size_t i = 0; i < specs.size(); ++i) {
      const std::vector<float> g = randn(specs[i].n, 1e-2f);
      upload_f32(be(), a.t[i].grad, g.data());
      upload_f32(be(), b.t[i].grad, g.data());
    }
    const Tensor sc = step == 3 ? Tensor() : scale;
    be().adamw_multi_step(st(), a.t, sc, hp);
    for (const AdamWTensor& t : b.t) {
      AdamWParams h = hp;
      h.weight_decay = t.weight_decay;
      be().adamw_step(st(), t.master ? t.master : t.param, t.grad, t.m, t.v, sc, h);
      if (t.master) be().copy(st(), t.param, t.master);
    }
    EXPECT_TRUE(bitwise_equal("adamw_multi_step against adamw_step + copy", state(a), state(b)))
        << "step " << step;
  }
  const std::vector<float> before = state(a);
  set(scale, {std::nanf("")});
  be().adamw_multi_step(st(), a.t, scale, AdamWParams{});
  EXPECT_TRUE(bitwise_equal("adamw_multi_step with a NaN scale", state(a), before));
  a.t[3].m = be().empty(Shape{a.t[3].param.numel() + 1}, DType::F32, MemCategory::OptimizerState);
  EXPECT_THROW(be().adamw_multi_step(st(), a.t, Tensor(), AdamWParams{}), Error);
}

// ---- ema_update ---------------------------------------------------------------------------

// The weights' moving average over a few updates, at awkward sizes, fp32 and bf16 (and
// fp16 where supported) parameters, against the same recurrence in double on the values
// the parameters hold. decay 1 leaves the average bitwise; decay 0 copies the parameters.
TEST_P(OpTest, EmaUpdate) {
  for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
    if (!be().supports(OpFamily::Ema, dt)) continue;
    for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{4099}, int64_t{13 * 79}}) {
      const std::string what = sizes({{"n", n}}) + "param " + std::string(dtype_name(dt));
      const std::vector<float> e0 = randn(n);
      Tensor ema = upload(e0, {n}, MemCategory::OptimizerState);
      Tensor param = be().empty(Shape{n}, dt, MemCategory::Parameters);
      Vec want = to_double(e0);
      for (const float decay : {0.9f, 0.999f, 0.5f, 0.f, 1.f}) {
        upload_f32(be(), param, randn(n).data());
        const std::vector<float> held = download_f32(be(), param);  // as rounded to dt
        const std::vector<float> before = download(ema);
        be().ema_update(st(), ema, param, decay);
        const std::vector<float> got = download(ema);
        const std::string at = what + " decay " + std::to_string(decay);
        if (decay == 1.f) {
          EXPECT_TRUE(bitwise_equal("ema_update decay 1", got, before)) << at;
        } else if (decay == 0.f) {
          EXPECT_TRUE(bitwise_equal("ema_update decay 0", got, held)) << at;
        }
        // Held to the size of the two terms: for one element they can nearly cancel.
        double terms_sq = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          const double t = double{decay} * std::fabs(want[i]) + (1.0 - double{decay}) * std::fabs(double{held[i]});
          terms_sq += t * t;
          want[i] = double{decay} * want[i] + (1.0 - double{decay}) * double{held[i]};
        }
        EXPECT_TRUE(near_by_norm("ema_update", got, want, 1e-6, std::sqrt(terms_sq))) << at;
        EXPECT_TRUE(bitwise_equal("ema_update leaves param", download_f32(be(), param), held)) << at;
        want = to_double(got);  // continue from the backend's state
      }
    }
  }
}

TEST_P(OpTest, EmaUpdateRejectsBadArguments) {
  Tensor ema = poisoned({10}), param = poisoned({10});
  EXPECT_THROW(be().ema_update(st(), poisoned({11}), param, 0.9f), Error);
  EXPECT_THROW(be().ema_update(st(), ema, param, 1.5f), Error);
  EXPECT_THROW(be().ema_update(st(), ema, param, -0.1f), Error);
  EXPECT_THROW(be().ema_update(st(), ema, param, std::nanf("")), Error);
  EXPECT_THROW(be().ema_update(st(), ema, upload_i32(std::vector<int32_t>(10, 0), {10}), 0.9f), Error);
  Tensor lowp = be().empty(Shape{10}, DType::BF16, MemCategory::OptimizerState);
  EXPECT_THROW(be().ema_update(st(), lowp, param, 0.9f), Error);  // the average is fp32
  be().fill(st(), ema, 1.f);
  be().fill(st(), param, 3.f);
  be().ema_update(st(), ema, param, 0.75f);  // the valid call
  EXPECT_EQ(download(ema), std::vector<float>(10, 1.5f));
}

}  // namespace
}  // namespace kiln::test

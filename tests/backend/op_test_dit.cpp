// The ops of diffusion transformers (DiT, Peebles & Xie 2023): SiLU, the adaLN modulation
// and gate with their backward, the rectified-flow inputs and the per-sample MSE loss,
// each against a double reference at awkward sizes, in fp32 and in bf16 and fp16 where
// the backend supports them (inputs rounded on the host, the reference computed from the
// rounded values), with in-place variants and central differences in fp32.
#include "core/dtype.h"
#include "op_harness.h"

#include <cmath>

namespace kiln::test {
namespace {

std::vector<DType> dtypes_of(Backend& be, OpFamily op) {
  std::vector<DType> v = {DType::F32};
  for (DType dt : {DType::BF16, DType::F16})
    if (be.supports(op, dt)) v.push_back(dt);
  return v;
}

// The tolerance by norm: one rounding to dt of each output, or `f32` for fp32.
double tol_for(DType dt, double f32) {
  return dt == DType::BF16 ? 8e-3 : dt == DType::F16 ? 2e-3 : f32;
}

std::vector<float> rounded(const std::vector<float>& v, DType dt) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(v[i]))
           : dt == DType::F16 ? f16_to_f32(f32_to_f16(v[i]))
                              : v[i];
  return r;
}

std::string label(const char* what, DType dt) {
  return std::string(what) + " " + std::string(dtype_name(dt));
}

Tensor upload_as(Backend& be, const std::vector<float>& v, const Shape& shape, DType dt) {
  Tensor t = be.empty(shape, dt, MemCategory::Activations);
  upload_f32(be, t, v.data());
  return t;
}

Tensor nan_as(Backend& be, const Shape& shape, DType dt) {
  const std::vector<float> nan(static_cast<size_t>(shape.numel()), std::nanf(""));
  return upload_as(be, nan, shape, dt);
}

TEST_P(OpTest, DitOpsSupportFp32) {
  for (OpFamily f : {OpFamily::Silu, OpFamily::Modulate, OpFamily::Unpatchify,
                     OpFamily::FlowMatching})
    EXPECT_TRUE(be().supports(f, DType::F32)) << family_name(f);
}

TEST_P(OpTest, Silu) {
  for (int64_t n : {1, 3, 7, 8, 13, 31, 64, 1023, 4097, 100003}) {
    std::vector<float> x = randn(n, 3.f);
    const float specials[] = {0.f, -0.f, 10.f, -10.f, 20.f, -20.f, -3.f, 1e-4f, -5.5f,
                              60.f, -60.f, 100.f, -100.f};
    for (size_t i = 0; i < std::size(specials) && static_cast<int64_t>(i) < n; ++i)
      x[(i * 7919) % n] = specials[i];
    const std::vector<float> dout = randn(n);
    const Shape shape = n % 3 == 0 ? Shape{3, n / 3} : Shape{n};
    for (DType dt : dtypes_of(be(), OpFamily::Silu)) {
      const std::vector<float> xr = rounded(x, dt), dr = rounded(dout, dt);
      Vec want(n), dwant(n);
      for (int64_t i = 0; i < n; ++i) {
        want[i] = ref::silu(xr[i]);
        dwant[i] = dr[i] * ref::silu_grad(xr[i]);
      }
      Tensor tx = upload_as(be(), x, shape, dt), out = nan_as(be(), shape, dt);
      be().silu_forward(st(), out, tx);
      const std::vector<float> y = download_f32(be(), out);
      // The natural scale (0.1 per element) where the exact values are near zero.
      const double scale = 0.1 * std::sqrt(static_cast<double>(n));
      EXPECT_TRUE(near_by_norm(label("silu_forward", dt), y, want, tol_for(dt, 1e-6), scale)) << n;

      Tensor tdout = upload_as(be(), dout, shape, dt), dinp = nan_as(be(), shape, dt);
      be().silu_backward(st(), dinp, tdout, tx);
      const std::vector<float> dx = download_f32(be(), dinp);
      // silu' has a root at x = -1.278: one element there cancels.
      EXPECT_TRUE(
          near_by_norm(label("silu_backward dinp", dt), dx, dwant, tol_for(dt, 1e-6), scale))
          << n;
      // In place: dinp aliases dout, out aliases inp.
      be().silu_backward(st(), tdout, tdout, tx);
      EXPECT_TRUE(bitwise_equal(label("silu_backward in place", dt), download_f32(be(), tdout), dx));
      be().silu_forward(st(), tx, tx);
      EXPECT_TRUE(bitwise_equal(label("silu_forward in place", dt), download_f32(be(), tx), y));

      if (dt == DType::F32) {
        const Forward f = [](const Inputs& in) {
          Vec o(in[0].size());
          for (size_t i = 0; i < o.size(); ++i) o[i] = ref::silu(in[0][i]);
          return o;
        };
        EXPECT_TRUE(check_fd("silu_backward dinp", f, {to_double(x)}, to_double(dout), 0, dwant,
                             to_double(dx), rng()));
      }
    }
  }
}

// The double reference of modulate and its gradients (dmod: the full [B,M,C] gradient,
// zero outside the scale and shift chunks).
struct ModCase {
  int B, T, C, M, scale, shift;
  float offset;
};
Vec modulate_ref(const Vec& x, const Vec& mod, const ModCase& c) {
  Vec out(x.size());
  for (int b = 0; b < c.B; ++b)
    for (int t = 0; t < c.T; ++t)
      for (int k = 0; k < c.C; ++k) {
        const size_t i = (static_cast<size_t>(b) * c.T + t) * c.C + k;
        const double sc = mod[(static_cast<size_t>(b) * c.M + c.scale) * c.C + k];
        const double sh = c.shift >= 0 ? mod[(static_cast<size_t>(b) * c.M + c.shift) * c.C + k] : 0.0;
        out[i] = x[i] * (c.offset + sc) + sh;
      }
  return out;
}
void modulate_backward_ref(Vec& dx, Vec& dmod, const Vec& dout, const Vec& x, const Vec& mod,
                           const ModCase& c) {
  dx.assign(x.size(), 0.0);
  dmod.assign(mod.size(), 0.0);
  for (int b = 0; b < c.B; ++b)
    for (int t = 0; t < c.T; ++t)
      for (int k = 0; k < c.C; ++k) {
        const size_t i = (static_cast<size_t>(b) * c.T + t) * c.C + k;
        const size_t si = (static_cast<size_t>(b) * c.M + c.scale) * c.C + k;
        dx[i] = dout[i] * (c.offset + mod[si]);
        dmod[si] += dout[i] * x[i];
        if (c.shift >= 0) dmod[(static_cast<size_t>(b) * c.M + c.shift) * c.C + k] += dout[i];
      }
}
// Whether element i of mod [B,M,C] lies in the scale or shift chunk.
bool written_chunk(size_t i, const ModCase& c) {
  const int m = static_cast<int>((i / c.C) % c.M);
  return m == c.scale || m == c.shift;
}

TEST_P(OpTest, Modulate) {
  for (const ModCase& c : {ModCase{1, 1, 1, 1, 0, -1, 1.f}, ModCase{2, 7, 13, 6, 1, 0, 1.f},
                           ModCase{3, 33, 40, 2, 0, 1, 1.f}, ModCase{2, 5, 67, 6, 5, -1, 0.f},
                           ModCase{1, 257, 130, 6, 4, 3, 1.f}, ModCase{2, 1025, 3, 3, 2, 0, 0.5f},
                           ModCase{4, 16, 96, 6, 2, -1, 0.f}}) {
    const std::string what =
        sizes({{"B", c.B}, {"T", c.T}, {"C", c.C}, {"M", c.M}, {"scale", c.scale},
               {"shift", c.shift}, {"offset*2", static_cast<int64_t>(c.offset * 2)}});
    const Shape xs{c.B, c.T, c.C}, ms{c.B, c.M, c.C};
    const int64_t nx = xs.numel(), nm = ms.numel();
    const std::vector<float> x = randn(nx), mod = randn(nm, 0.5f), dout = randn(nx),
                             dmod0 = randn(nm);
    for (DType dt : dtypes_of(be(), OpFamily::Modulate)) {
      const std::vector<float> xr = rounded(x, dt), mr = rounded(mod, dt), dr = rounded(dout, dt),
                               d0 = rounded(dmod0, dt);
      // Forward, then in place (out aliases x).
      Tensor tx = upload_as(be(), x, xs, dt), tm = upload_as(be(), mod, ms, dt);
      Tensor out = nan_as(be(), xs, dt);
      be().modulate(st(), out, tx, tm, c.scale, c.shift, c.offset);
      const std::vector<float> y = download_f32(be(), out);
      // Cancellation (1 + scale near 0, x (1 + scale) near -shift) is natural at one
      // element: the norm is at least 0.1 per element.
      const double scale = 0.1 * std::sqrt(static_cast<double>(nx));
      EXPECT_TRUE(near_by_norm(label("modulate out", dt), y,
                               modulate_ref(to_double(xr), to_double(mr), c), tol_for(dt, 1e-6),
                               scale))
          << what;
      Tensor tx2 = upload_as(be(), x, xs, dt);
      be().modulate(st(), tx2, tx2, tm, c.scale, c.shift, c.offset);
      EXPECT_TRUE(bitwise_equal(label("modulate in place", dt), download_f32(be(), tx2), y))
          << what;

      // Backward: dx separate, dx aliasing dout, dx empty; dmod's other chunks untouched.
      Vec gdx, gdmod;
      modulate_backward_ref(gdx, gdmod, to_double(dr), to_double(xr), to_double(mr), c);
      Vec want_chunks;
      for (int64_t i = 0; i < nm; ++i)
        if (written_chunk(static_cast<size_t>(i), c)) want_chunks.push_back(gdmod[i]);
      std::vector<float> dx_first, dmod_first;
      for (int variant = 0; variant < 3; ++variant) {
        const char* how = variant == 0 ? "" : variant == 1 ? " (dx aliases dout)" : " (no dx)";
        Tensor tdout = upload_as(be(), dout, xs, dt);
        Tensor dx = variant == 0 ? nan_as(be(), xs, dt) : variant == 1 ? tdout : Tensor();
        Tensor dmod = upload_as(be(), dmod0, ms, dt);
        be().modulate_backward(st(), dx, dmod, tdout, tx, tm, c.scale, c.shift, c.offset);
        const std::vector<float> gm = download_f32(be(), dmod);
        std::vector<float> got_chunks;
        for (int64_t i = 0; i < nm; ++i) {
          if (written_chunk(static_cast<size_t>(i), c)) {
            got_chunks.push_back(gm[i]);
          } else {
            ASSERT_EQ(f32_bits(gm[i]), f32_bits(d0[i]))
                << what << how << ": dmod element " << i << " outside the chunks was changed";
          }
        }
        EXPECT_TRUE(near_by_norm(label("modulate_backward dmod", dt), got_chunks, want_chunks,
                                 tol_for(dt, 1e-5)))
            << what << how;
        if (variant == 2) {
          EXPECT_TRUE(bitwise_equal(label("modulate_backward dmod (no dx)", dt), gm, dmod_first))
              << what;
          EXPECT_TRUE(bitwise_equal(label("modulate_backward dout kept (no dx)", dt),
                                    download_f32(be(), tdout), dr))
              << what;
          continue;
        }
        const std::vector<float> gx = download_f32(be(), dx);
        EXPECT_TRUE(near_by_norm(label("modulate_backward dx", dt), gx, gdx, tol_for(dt, 1e-6),
                                 scale))
            << what << how;
        if (variant == 0) {
          dx_first = gx;
          dmod_first = gm;
          if (dt == DType::F32) {
            const Forward f = [c](const Inputs& in) { return modulate_ref(in[0], in[1], c); };
            const Inputs in = {to_double(x), to_double(mod)};
            Vec got_dmod(static_cast<size_t>(nm), 0.0);
            for (int64_t i = 0; i < nm; ++i)
              if (written_chunk(static_cast<size_t>(i), c)) got_dmod[i] = gm[i];
            EXPECT_TRUE(check_fd("modulate_backward dx", f, in, to_double(dout), 0, gdx,
                                 to_double(gx), rng()))
                << what;
            EXPECT_TRUE(check_fd("modulate_backward dmod", f, in, to_double(dout), 1, gdmod,
                                 got_dmod, rng()))
                << what;
          }
        } else {
          EXPECT_TRUE(bitwise_equal(label("modulate_backward dx aliasing dout", dt), gx, dx_first))
              << what;
          EXPECT_TRUE(bitwise_equal(label("modulate_backward dmod with dx aliasing dout", dt), gm,
                                    dmod_first))
              << what;
        }
      }
    }
  }
}

TEST_P(OpTest, ModulateRejectsBadShapes) {
  auto t = [&](const Shape& s) { return poisoned(s); };
  Tensor x = upload(randn(2 * 3 * 4), {2, 3, 4}), mod = upload(randn(2 * 6 * 4), {2, 6, 4});
  EXPECT_THROW(be().modulate(st(), t({2, 3, 5}), x, mod, 0, 1, 1.f), Error);   // out shape
  EXPECT_THROW(be().modulate(st(), t({2, 3, 4}), x, t({2, 6, 5}), 0, 1, 1.f), Error);  // mod C
  EXPECT_THROW(be().modulate(st(), t({2, 3, 4}), x, t({3, 6, 4}), 0, 1, 1.f), Error);  // mod B
  EXPECT_THROW(be().modulate(st(), t({2, 3, 4}), x, t({12, 4}), 0, 1, 1.f), Error);    // rank
  EXPECT_THROW(be().modulate(st(), t({6, 4}), t({6, 4}), mod, 0, 1, 1.f), Error);      // x rank
  EXPECT_THROW(be().modulate(st(), t({2, 3, 4}), x, mod, 6, -1, 1.f), Error);   // scale >= M
  EXPECT_THROW(be().modulate(st(), t({2, 3, 4}), x, mod, -1, 0, 1.f), Error);   // scale < 0
  EXPECT_THROW(be().modulate(st(), t({2, 3, 4}), x, mod, 0, 6, 1.f), Error);    // shift >= M
  EXPECT_THROW(be().modulate(st(), t({2, 3, 4}), x, mod, 0, -2, 1.f), Error);   // shift < -1
  EXPECT_THROW(be().modulate(st(), t({2, 3, 4}), x, mod, 2, 2, 1.f), Error);    // shift == scale
  Tensor xb = be().empty({2, 3, 4}, DType::BF16, MemCategory::Activations);
  be().fill(st(), xb, 1.f);
  EXPECT_THROW(be().modulate(st(), t({2, 3, 4}), xb, mod, 0, 1, 1.f), Error);   // mixed dtypes
  // Backward: dmod of mod's shape, dx of x's shape (or empty), dout of x's shape.
  EXPECT_THROW(be().modulate_backward(st(), t({2, 3, 4}), t({2, 5, 4}), t({2, 3, 4}), x, mod, 0,
                                      1, 1.f), Error);
  EXPECT_THROW(be().modulate_backward(st(), t({2, 3, 5}), t({2, 6, 4}), t({2, 3, 4}), x, mod, 0,
                                      1, 1.f), Error);
  EXPECT_THROW(be().modulate_backward(st(), Tensor(), t({2, 6, 4}), t({2, 4, 4}), x, mod, 0, 1,
                                      1.f), Error);
  EXPECT_THROW(be().modulate_backward(st(), Tensor(), t({2, 6, 4}), t({2, 3, 4}), x, mod, 3, 3,
                                      1.f), Error);
  // The valid calls.
  be().modulate(st(), t({2, 3, 4}), x, mod, 5, 0, 1.f);
  be().modulate(st(), t({2, 3, 4}), x, mod, 2, -1, 0.f);
  be().modulate_backward(st(), Tensor(), t({2, 6, 4}), t({2, 3, 4}), x, mod, 0, -1, 0.f);
  be().modulate_backward(st(), t({2, 3, 4}), t({2, 6, 4}), t({2, 3, 4}), x, mod, 1, 4, 1.f);
}

TEST_P(OpTest, RectifiedFlowInputs) {
  for (const Shape& shape : {Shape{1}, Shape{3, 5}, Shape{2, 7, 9, 3}, Shape{5, 4, 4, 4},
                             Shape{1, 100003}, Shape{7, 33}}) {
    const int64_t B = shape[0], n = shape.numel() / B, N = shape.numel();
    const std::vector<float> img = randn(N), noise = randn(N, 1.f, 0.2f);
    std::vector<float> t = randu(B, 0.f, 1.f);
    if (B >= 2) t[0] = 0.f, t[B - 1] = 1.f;
    Vec want(N);
    std::vector<float> want_target(N);
    for (int64_t i = 0; i < N; ++i) {
      const double tb = t[i / n];
      want[i] = (1.0 - tb) * img[i] + tb * noise[i];
      want_target[i] = noise[i] - img[i];  // one fp32 rounding of the exact difference
    }
    Tensor ti = upload(img, shape), tn = upload(noise, shape), tt = upload(t, {B});
    Tensor xt = poisoned(shape), target = poisoned(shape);
    be().rectified_flow_inputs(st(), xt, target, ti, tn, tt);
    const std::vector<float> gx = download(xt), gt = download(target);
    // (1 - t) x0 + t x1 may cancel at one element: the norm is at least 0.1 per element.
    EXPECT_TRUE(near_by_norm("rectified_flow_inputs xt", gx, want, 1e-6,
                             0.1 * std::sqrt(static_cast<double>(N))))
        << shape.str();
    EXPECT_TRUE(bitwise_equal("rectified_flow_inputs target " + shape.str(), gt, want_target));
    if (B >= 2) {  // t = 0 is the data, t = 1 the noise, exactly
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(gx[i], img[i]) << "t = 0, element " << i;
      for (int64_t i = (B - 1) * n; i < N; ++i) ASSERT_EQ(gx[i], noise[i]) << "t = 1, element " << i;
    }
    // In place: xt over the noise, target over the images.
    be().rectified_flow_inputs(st(), tn, ti, ti, tn, tt);
    EXPECT_TRUE(bitwise_equal("rectified_flow_inputs xt in place " + shape.str(), download(tn), gx));
    EXPECT_TRUE(bitwise_equal("rectified_flow_inputs target in place " + shape.str(), download(ti),
                              gt));
  }
}

TEST_P(OpTest, MseLoss) {
  for (const Shape& shape : {Shape{1}, Shape{3, 1}, Shape{2, 7, 13}, Shape{4, 3, 5, 5},
                             Shape{2, 4097}, Shape{1, 100003}, Shape{5, 2 * 8192 + 3}}) {
    const int64_t B = shape[0], n = shape.numel() / B, N = shape.numel();
    const float grad_scale = B % 2 ? 1.f : 0.37f;
    const std::vector<float> pred = randn(N), target = randn(N, 1.5f, 0.1f);
    for (DType dt : dtypes_of(be(), OpFamily::FlowMatching)) {
      const std::vector<float> pr = rounded(pred, dt);
      Vec want(B, 0.0), dwant(N);
      for (int64_t i = 0; i < N; ++i) {
        const double d = static_cast<double>(pr[i]) - target[i];
        want[i / n] += d * d / static_cast<double>(n);
        dwant[i] = grad_scale * 2.0 * d / static_cast<double>(n);
      }
      Tensor tp = upload_as(be(), pred, shape, dt), tt = upload(target, shape);
      Tensor losses = poisoned({B}), dpred = nan_as(be(), shape, dt);
      be().mse_loss(st(), losses, dpred, tp, tt, grad_scale);
      const std::vector<float> gl = download(losses), gd = download_f32(be(), dpred);
      EXPECT_TRUE(near_by_norm(label("mse_loss losses", dt), gl, want, 1e-5)) << shape.str();
      EXPECT_TRUE(near_by_norm(label("mse_loss dpred", dt), gd, dwant, tol_for(dt, 1e-6)))
          << shape.str();
      // Without dpred: the same losses.
      Tensor l2 = poisoned({B});
      be().mse_loss(st(), l2, Tensor(), tp, tt, grad_scale);
      EXPECT_TRUE(near_by_norm(label("mse_loss losses (no dpred)", dt), download(l2), want, 1e-5))
          << shape.str();
      // dpred aliasing pred.
      Tensor l3 = poisoned({B});
      be().mse_loss(st(), l3, tp, tp, tt, grad_scale);
      EXPECT_TRUE(bitwise_equal(label("mse_loss dpred in place", dt), download_f32(be(), tp), gd))
          << shape.str();
      EXPECT_TRUE(bitwise_equal(label("mse_loss losses (dpred in place)", dt), download(l3), gl))
          << shape.str();
      // Central differences of a mean over many elements drown in its rounding: small n.
      if (dt == DType::F32 && n <= 5000) {
        const Forward f = [B, n, target](const Inputs& in) {
          Vec l(static_cast<size_t>(B), 0.0);
          for (int64_t i = 0; i < B * n; ++i) {
            const double d = in[0][i] - target[i];
            l[i / n] += d * d / static_cast<double>(n);
          }
          return l;
        };
        EXPECT_TRUE(check_fd("mse_loss dpred", f, {to_double(pred)}, Vec(B, grad_scale), 0, dwant,
                             to_double(gd), rng()))
            << shape.str();
      }
    }
  }
}

TEST_P(OpTest, FlowMatchingRejectsBadShapes) {
  auto t = [&](const Shape& s) { return poisoned(s); };
  Tensor img = upload(randn(24), {2, 3, 4}), noise = upload(randn(24), {2, 3, 4});
  Tensor tb = upload(randu(2, 0.f, 1.f), {2});
  EXPECT_THROW(be().rectified_flow_inputs(st(), t({2, 3, 4}), t({2, 3, 4}), img, t({2, 12}), tb),
               Error);  // noise shape
  EXPECT_THROW(be().rectified_flow_inputs(st(), t({2, 3, 5}), t({2, 3, 4}), img, noise, tb),
               Error);  // xt shape
  EXPECT_THROW(be().rectified_flow_inputs(st(), t({2, 3, 4}), t({2, 3, 4}), img, noise, t({3})),
               Error);  // t size
  EXPECT_THROW(be().rectified_flow_inputs(st(), t({2, 3, 4}), t({2, 3, 4}), img, noise, t({2, 1})),
               Error);  // t rank
  Tensor same = t({2, 3, 4});
  EXPECT_THROW(be().rectified_flow_inputs(st(), same, same, img, noise, tb), Error);  // xt == target
  Tensor ib = be().empty({2, 3, 4}, DType::BF16, MemCategory::Activations);
  be().fill(st(), ib, 0.f);
  EXPECT_THROW(be().rectified_flow_inputs(st(), t({2, 3, 4}), t({2, 3, 4}), ib, noise, tb),
               Error);  // not fp32
  be().rectified_flow_inputs(st(), t({2, 3, 4}), t({2, 3, 4}), img, noise, tb);  // valid

  EXPECT_THROW(be().mse_loss(st(), t({3}), Tensor(), img, noise, 1.f), Error);       // losses [B]
  EXPECT_THROW(be().mse_loss(st(), t({2, 1}), Tensor(), img, noise, 1.f), Error);    // losses rank
  EXPECT_THROW(be().mse_loss(st(), t({2}), Tensor(), img, t({2, 12}), 1.f), Error);  // target
  EXPECT_THROW(be().mse_loss(st(), t({2}), t({2, 3, 5}), img, noise, 1.f), Error);   // dpred
  EXPECT_THROW(be().mse_loss(st(), t({2}), Tensor(), img, ib, 1.f), Error);  // target not fp32
  EXPECT_THROW(be().mse_loss(st(), t({2}), Tensor(), t({2, 0}), t({2, 0}), 1.f), Error);  // n = 0
  EXPECT_THROW(be().mse_loss(st(), t({2}), ib, img, noise, 1.f), Error);  // dpred dtype
  be().mse_loss(st(), t({2}), t({2, 3, 4}), img, noise, 1.f);  // valid
  be().mse_loss(st(), t({2}), Tensor(), img, noise, 1.f);
}

}  // namespace
}  // namespace kiln::test

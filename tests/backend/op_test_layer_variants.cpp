// The ops of blocks other than GPT-2's, and the optional operands: embeddings at explicit
// positions and without a position table, LayerNorm without gain or shift, RMSNorm,
// SwiGLU and rotary position embedding, each against its double reference and central
// differences.
#include "op_harness.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace kiln::test {
namespace {

Vec plus(const Vec& a, const std::vector<float>& b) {
  Vec v = a;
  for (size_t i = 0; i < v.size(); ++i) v[i] += b[i];
  return v;
}

// Explicit positions (repeated, out of order) with and without a position table.
TEST_P(OpTest, EmbeddingPositionsAndNoTable) {
  struct Cfg { int B, T, C, Vp, maxT; bool table; };
  for (const Cfg& c : {Cfg{1, 1, 1, 3, 1, true}, Cfg{2, 7, 13, 37, 5, true},
                       Cfg{3, 33, 40, 70, 100, true}, Cfg{2, 9, 6, 11, 0, false},
                       Cfg{1, 50, 64, 300, 0, false}}) {
    const std::string what = sizes({{"B", c.B}, {"T", c.T}, {"C", c.C}, {"Vp", c.Vp},
                                    {"maxT", c.maxT}, {"table", c.table}});
    const int N = c.B * c.T;
    std::vector<int32_t> tok(N), pos(N);
    for (int i = 0; i < N; ++i) {
      tok[i] = randint(0, c.Vp - 1);
      pos[i] = c.table ? randint(0, std::min(c.maxT - 1, 3)) : 0;  // few rows: collisions
    }
    if (c.table) pos[N - 1] = c.maxT - 1;
    const std::vector<float> wte = randn(int64_t{c.Vp} * c.C), wpe = randn(int64_t{c.maxT} * c.C);
    Tensor ttok = upload_i32(tok, {c.B, c.T}), tpos = upload_i32(pos, {c.B, c.T});
    Tensor twte = upload(wte, {c.Vp, c.C}, MemCategory::Parameters);
    Tensor twpe = c.table ? upload(wpe, {c.maxT, c.C}, MemCategory::Parameters) : Tensor();
    Tensor out = poisoned({c.B, c.T, c.C});
    be().embedding_forward(st(), out, ttok, c.table ? tpos : Tensor(), twte, twpe);
    const Vec rwpe = c.table ? to_double(wpe) : Vec();
    const std::vector<int32_t> rpos = c.table ? pos : std::vector<int32_t>();
    EXPECT_TRUE(near_by_norm("embedding_forward (positions)", download(out),
                             ref::embedding_forward(tok, to_double(wte), rwpe, c.B, c.T, c.C, rpos),
                             1e-6)) << what;

    const std::vector<float> dout = randn(int64_t{N} * c.C);
    const std::vector<float> dwte0 = randn(int64_t{c.Vp} * c.C), dwpe0 = randn(int64_t{c.maxT} * c.C);
    Tensor dwte = upload(dwte0, {c.Vp, c.C}, MemCategory::Gradients);
    Tensor dwpe = c.table ? upload(dwpe0, {c.maxT, c.C}, MemCategory::Gradients) : Tensor();
    be().embedding_backward(st(), dwte, dwpe, upload(dout, {c.B, c.T, c.C}), ttok,
                            c.table ? tpos : Tensor());
    Vec gwte, gwpe;
    ref::embedding_backward(gwte, gwpe, to_double(dout), tok, c.B, c.T, c.C, c.Vp, c.maxT, rpos);
    EXPECT_TRUE(near_by_norm("embedding_backward dwte (+=)", download(dwte), plus(gwte, dwte0), 1e-6))
        << what;
    if (c.table) {
      EXPECT_TRUE(near_by_norm("embedding_backward dwpe at positions (+=)", download(dwpe),
                               plus(gwpe, dwpe0), 1e-6)) << what;
    }
  }
}

TEST_P(OpTest, LayerNormWithoutGainOrShift) {
  const float eps = 1e-5f;
  for (const auto& [N, C, gain, shift] :
       {std::tuple{1, 1, false, false}, std::tuple{7, 33, false, false}, std::tuple{5, 64, true, false},
        std::tuple{9, 17, false, true}}) {
    const std::string what = sizes({{"N", N}, {"C", C}, {"gain", gain}, {"shift", shift}});
    const int64_t NC = int64_t{N} * C;
    const std::vector<float> x = randn(NC, 2.f, 0.5f), w = randn(C, 0.5f, 1.f), b = randn(C, 0.2f);
    const Vec rw = gain ? to_double(w) : Vec(C, 1.0), rb = shift ? to_double(b) : Vec(C, 0.0);
    Tensor tw = gain ? upload(w, {C}, MemCategory::Parameters) : Tensor();
    Tensor tb = shift ? upload(b, {C}, MemCategory::Parameters) : Tensor();
    Tensor tx = upload(x, {N, C});
    Tensor out = poisoned({N, C}), mean = poisoned({N}), rstd = poisoned({N});
    be().layernorm_forward(st(), out, mean, rstd, tx, tw, tb, eps);
    Vec rout, rmean, rrstd;
    ref::layernorm_forward(rout, rmean, rrstd, to_double(x), rw, rb, N, C, eps);
    EXPECT_TRUE(near_by_norm("layernorm_forward out", download(out), rout, 1e-5)) << what;

    const std::vector<float> dout = randn(NC), dinp0 = randn(NC), dw0 = randn(C), db0 = randn(C);
    Tensor dinp = upload(dinp0, {N, C});
    Tensor dw = gain ? upload(dw0, {C}, MemCategory::Gradients) : Tensor();
    Tensor db = shift ? upload(db0, {C}, MemCategory::Gradients) : Tensor();
    be().layernorm_backward(st(), dinp, dw, db, upload(dout, {N, C}), tx, tw, mean, rstd);
    Vec gx, gw, gb;
    ref::layernorm_backward(gx, gw, gb, to_double(dout), to_double(x), rw, rmean, rrstd, N, C);
    double scale = 0;  // as in LayerNorm: dinp's natural size
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < C; ++i) scale += std::pow(rrstd[n] * dout[int64_t{n} * C + i] * rw[i], 2);
    EXPECT_TRUE(near_by_norm("layernorm_backward dinp (+=)", to_float(minus(download(dinp), dinp0)),
                             gx, 1e-5, std::max(std::sqrt(scale), accumulated_min_norm(dinp0, 1e-5))))
        << what;
    if (gain) {
      EXPECT_TRUE(near_by_norm("layernorm_backward dweight", to_float(minus(download(dw), dw0)), gw, 1e-5,
                               accumulated_min_norm(dw0, 1e-5)))
          << what;
    }
    if (shift) {
      EXPECT_TRUE(near_by_norm("layernorm_backward dbias", to_float(minus(download(db), db0)), gb, 1e-5,
                               accumulated_min_norm(db0, 1e-5)))
          << what;
    }
  }
}

TEST_P(OpTest, RMSNorm) {
  const float eps = 1e-6f;
  for (const auto& [N, C, gain] : {std::tuple{1, 1, true}, std::tuple{3, 7, true}, std::tuple{13, 64, true},
                                   std::tuple{64, 769, true}, std::tuple{5, 33, false},
                                   std::tuple{2, 1600, true}}) {
    const std::string what = sizes({{"N", N}, {"C", C}, {"gain", gain}});
    const int64_t NC = int64_t{N} * C;
    std::vector<float> x = randn(NC);
    for (int n = 0; n < N; ++n) {  // per-row scale, like a residual stream
      const float sc = randu(1, 0.3f, 4.f)[0];
      for (int i = 0; i < C; ++i) x[int64_t{n} * C + i] *= sc;
    }
    const std::vector<float> w = randn(C, 0.5f, 1.f);
    const Vec rw = gain ? to_double(w) : Vec();
    Tensor tx = upload(x, {N, C}), tw = gain ? upload(w, {C}, MemCategory::Parameters) : Tensor();
    Tensor out = poisoned({N, C}), rstd = poisoned({N});
    be().rmsnorm_forward(st(), out, rstd, tx, tw, eps);
    Vec rout, rrstd;
    ref::rmsnorm_forward(rout, rrstd, to_double(x), rw, N, C, eps);
    EXPECT_TRUE(near_by_norm("rmsnorm_forward out", download(out), rout, 1e-5)) << what;
    EXPECT_TRUE(near_by_norm("rmsnorm_forward rstd", download(rstd), rrstd, 1e-5)) << what;

    const std::vector<float> dout = randn(NC), dinp0 = randn(NC), dw0 = randn(C);
    Tensor dinp = upload(dinp0, {N, C});
    Tensor dw = gain ? upload(dw0, {C}, MemCategory::Gradients) : Tensor();
    be().rmsnorm_backward(st(), dinp, dw, upload(dout, {N, C}), tx, tw,
                          upload(to_float(rrstd), {N}));
    Vec gx, gw;
    ref::rmsnorm_backward(gx, gw, to_double(dout), to_double(x), rw, rrstd, N, C);
    const Vec got_x = minus(download(dinp), dinp0);
    double scale = 0;  // ||rstd * dout * w||, the size of dinp where it cancels (C = 1)
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < C; ++i)
        scale += std::pow(rrstd[n] * dout[int64_t{n} * C + i] * (gain ? w[i] : 1.f), 2);
    scale = std::sqrt(scale);
    EXPECT_TRUE(near_by_norm("rmsnorm_backward dinp (+=)", to_float(got_x), gx, 1e-5,
                             std::max(scale, accumulated_min_norm(dinp0, 1e-5)))) << what;
    const Forward f = [&](const Inputs& in) {
      Vec o, r;
      ref::rmsnorm_forward(o, r, in[0], gain ? in[1] : Vec(), N, C, eps);
      return o;
    };
    const Inputs in = {to_double(x), to_double(w)};
    EXPECT_TRUE(check_fd("rmsnorm_backward dinp", f, in, to_double(dout), 0, gx, got_x, rng(), 8,
                         1e-4, scale / std::sqrt(static_cast<double>(NC)))) << what;
    if (gain) {
      const Vec got_w = minus(download(dw), dw0);
      EXPECT_TRUE(near_by_norm("rmsnorm_backward dweight (+=)", to_float(got_w), gw, 1e-5,
                               accumulated_min_norm(dw0, 1e-5))) << what;
      EXPECT_TRUE(check_fd("rmsnorm_backward dweight", f, in, to_double(dout), 1, gw, got_w, rng()))
          << what;
    }
  }
}

TEST_P(OpTest, SwiGLU) {
  for (const auto& [N, H] : {std::pair{1, 1}, std::pair{3, 5}, std::pair{17, 64}, std::pair{64, 333}}) {
    const std::string what = sizes({{"N", N}, {"H", H}});
    std::vector<float> x = randn(int64_t{N} * 2 * H, 2.f);
    x[0] = 95.f;  // far tails: the sigmoid must neither overflow nor lose the gate
    if (x.size() > 2) x[1] = -95.f;
    Tensor tx = upload(x, {N, 2 * H}), out = poisoned({N, H});
    be().swiglu_forward(st(), out, tx);
    const Forward f = [&](const Inputs& in) {
      Vec o(static_cast<size_t>(N) * H);
      for (int n = 0; n < N; ++n)
        for (int i = 0; i < H; ++i)
          o[static_cast<size_t>(n) * H + i] = ref::silu(in[0][static_cast<size_t>(n) * 2 * H + i]) *
                                              in[0][static_cast<size_t>(n) * 2 * H + H + i];
      return o;
    };
    const Inputs in = {to_double(x)};
    EXPECT_TRUE(near_by_norm("swiglu_forward", download(out), f(in), 1e-6)) << what;

    const std::vector<float> dout = randn(int64_t{N} * H);
    Tensor dinp = poisoned({N, 2 * H});
    be().swiglu_backward(st(), dinp, upload(dout, {N, H}), tx);
    Vec want(x.size());
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < H; ++i) {
        const size_t g = static_cast<size_t>(n) * 2 * H + i, o = static_cast<size_t>(n) * H + i;
        want[g] = dout[o] * x[g + H] * ref::silu_grad(x[g]);
        want[g + H] = dout[o] * ref::silu(x[g]);
      }
    const std::vector<float> got = download(dinp);
    EXPECT_TRUE(near_by_norm("swiglu_backward", got, want, 1e-6)) << what;
    EXPECT_TRUE(check_fd("swiglu_backward", f, in, to_double(dout), 0, want, to_double(got), rng()))
        << what;
  }
}

// Rotary: q and k heads turned, v untouched, backward the transpose; explicit positions
// (large ones too) and the Llama 3 frequency rescaling.
TEST_P(OpTest, Rope) {
  struct Cfg { int B, T, NH, NKV, HD; bool positions; double scale; };
  for (const Cfg& c : {Cfg{1, 1, 1, 1, 2, false, 0}, Cfg{2, 7, 3, 3, 4, false, 0},
                       Cfg{1, 19, 4, 2, 16, true, 0}, Cfg{2, 33, 6, 1, 64, true, 8.0},
                       Cfg{1, 5, 2, 2, 128, true, 32.0}}) {
    const std::string what = sizes({{"B", c.B}, {"T", c.T}, {"NH", c.NH}, {"NKV", c.NKV},
                                    {"HD", c.HD}, {"positions", c.positions}});
    const ref::Attn a{c.B, c.T, c.NH, c.NKV, c.HD, true};
    const AttentionShape shape{c.NH, c.NKV, c.HD, true};
    RopeSpec rope;
    rope.theta = c.scale > 0 ? 500000.0 : 10000.0;
    rope.scale_factor = c.scale;
    const int W = (c.NH + 2 * c.NKV) * c.HD;
    std::vector<int32_t> pos;
    if (c.positions)
      for (int i = 0; i < c.B * c.T; ++i) pos.push_back(randint(0, 9000));
    const std::vector<float> inv_freq = rope_inv_freq(rope, c.HD);
    const std::vector<float> x = randn(int64_t{c.B} * c.T * W);
    Tensor tx = upload(x, {c.B, c.T, W});
    Tensor tpos = c.positions ? upload_i32(pos, {c.B, c.T}) : Tensor();
    be().rope_forward(st(), tx, tpos, shape, rope);
    Vec want = to_double(x);
    ref::rope(want, pos, inv_freq, a, 1.0);
    const std::vector<float> got = download(tx);
    EXPECT_TRUE(near_by_norm("rope_forward", got, want, 2e-6)) << what;
    for (int bt = 0; bt < c.B * c.T; ++bt)  // v bit for bit
      for (int i = (c.NH + c.NKV) * c.HD; i < W; ++i)
        ASSERT_EQ(got[static_cast<size_t>(bt) * W + i], x[static_cast<size_t>(bt) * W + i]) << what;

    Tensor dx = upload(x, {c.B, c.T, W});
    be().rope_backward(st(), dx, tpos, shape, rope);
    Vec wantd = to_double(x);
    ref::rope(wantd, pos, inv_freq, a, -1.0);
    EXPECT_TRUE(near_by_norm("rope_backward", download(dx), wantd, 2e-6)) << what;
  }
  // The frequencies themselves: theta^(-2i/HD), and the Llama 3.1 bands (long
  // wavelengths / factor, short ones kept).
  const std::vector<float> f = rope_inv_freq(RopeSpec{}, 8);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i], std::pow(10000.0, -2.0 * i / 8), 1e-7 * f[i]);
  RopeSpec l3;
  l3.theta = 500000.0;
  l3.scale_factor = 8.0;
  const std::vector<float> base = rope_inv_freq(RopeSpec{500000.0}, 128), g = rope_inv_freq(l3, 128);
  EXPECT_FLOAT_EQ(g.front(), base.front());       // wavelength 2 pi: kept
  EXPECT_FLOAT_EQ(g.back(), base.back() / 8.0f);  // wavelength far beyond 8192: divided
  EXPECT_THROW(rope_inv_freq(RopeSpec{}, 7), Error);
}

TEST_P(OpTest, VariantBadShapesThrow) {
  auto t = [&](const Shape& s) { return poisoned(s); };
  EXPECT_THROW(be().rmsnorm_forward(st(), t({3, 5}), t({3}), t({3, 5}), t({4}), 1e-5f), Error);
  EXPECT_THROW(be().rmsnorm_forward(st(), t({3, 5}), t({2}), t({3, 5}), Tensor(), 1e-5f), Error);
  EXPECT_THROW(be().swiglu_forward(st(), t({3, 2}), t({3, 5})), Error);
  EXPECT_THROW(be().swiglu_forward(st(), t({3, 3}), t({3, 4})), Error);
  // 3 query heads cannot share 2 key/value heads; the widths must match the shape.
  EXPECT_THROW(be().attention_forward(st(), t({1, 2, 6}), t({1, 3, 2}), t({1, 2, 14}),
                                      AttentionShape{3, 2, 2, true}, DropoutSpec{}), Error);
  EXPECT_THROW(be().attention_forward(st(), t({1, 2, 8}), t({1, 4, 2}), t({1, 2, 24}),
                                      AttentionShape{4, 2, 2, true}, DropoutSpec{}), Error);
  EXPECT_THROW(be().rope_forward(st(), t({1, 2, 9}), Tensor(), AttentionShape{1, 1, 3, true},
                                 RopeSpec{}), Error);
  EXPECT_THROW(be().embedding_forward(st(), t({1, 2, 4}), upload_i32({0, 1}, {1, 2}),
                                      upload_i32({0}, {1, 1}), t({5, 4}), t({3, 4})), Error);
}

}  // namespace
}  // namespace kiln::test

// The layer library on the CPU backend: a transformer block's backward against central
// differences of its forward (fp32, awkward sizes, dropout on), the three checkpointing
// policies giving bitwise the same gradients, the recompute classes, initial values by
// global element coordinates, the classifier's chunking (train.classifier_chunk_mb) not
// changing its result, and clear errors for what the backends cannot do yet.
#include "backend/registry.h"
#include "nn/block.h"
#include "nn/classifier.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

namespace kiln::nn {
namespace {

// Binds every parameter of `params` to views of one value and one gradient buffer.
struct Bound {
  Tensor values, grads;
  std::vector<int64_t> offsets;
};
Bound bind_params(Backend& be, const std::vector<Param*>& params) {
  Bound b;
  int64_t n = 0;
  for (Param* p : params) b.offsets.push_back(n), n += p->shape.numel();
  b.values = be.empty(Shape{n}, DType::F32, MemCategory::Parameters);
  b.grads = be.empty(Shape{n}, DType::F32, MemCategory::Gradients);
  be.fill(be.default_stream(), b.grads, 0.f);
  for (size_t i = 0; i < params.size(); ++i) {
    params[i]->value = b.values.view_at(b.offsets[i], params[i]->shape);
    params[i]->grad = b.grads.view_at(b.offsets[i], params[i]->shape);
  }
  return b;
}

std::vector<float> host(Backend& be, const Tensor& t) { return download_f32(be, t); }

BlockSpec awkward_spec() {
  BlockSpec s;
  s.n_embd = 15;
  s.attention.n_head = 3;
  s.attention.head_dim = 5;
  s.mlp_hidden = 37;
  s.init_std = 0.3f;  // larger than GPT-2's so that the function is not flat
  s.residual_init_std = 0.3f;
  return s;
}

// One block, forward and backward, of L = sum(out * R) for a fixed random R.
struct BlockRig {
  std::unique_ptr<Backend> be = make_backend("cpu");
  TransformerBlock block{"h.0.", awkward_spec()};
  std::vector<Param*> params;
  Bound bound;
  SavedActivations saved;
  BlockScratch scratch;
  int B = 2, T = 7;
  Tensor x, out, dres, r;
  DropoutSpec probs, resid_a, resid_m;

  BlockRig(ActivationCheckpointing mode, float p, uint64_t seed) {
    block.collect(params);
    bound = bind_params(*be, params);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> w(static_cast<size_t>(bound.values.numel()));
    for (size_t i = 0; i < params.size(); ++i) {
      auto v = init_values(*params[i], 5, i, 0, params[i]->shape.numel());
      for (size_t j = 0; j < v.size(); ++j) w[bound.offsets[i] + j] = v[j] + 0.1f * nd(rng);
    }
    upload_f32(*be, bound.values, w.data());
    const int64_t C = awkward_spec().n_embd;
    saved.reserve(*be, block.saved_specs(B, T, DType::F32), 1, mode);
    scratch = block.make_scratch(*be, B, T, DType::F32);
    auto act = [&] { return be->empty(Shape{B, T, C}, DType::F32, MemCategory::Activations); };
    x = act(), out = act(), dres = act(), r = act();
    std::vector<float> xv(static_cast<size_t>(B * T * C)), rv(xv.size());
    for (auto& v : xv) v = nd(rng);
    for (auto& v : rv) v = nd(rng);
    upload_f32(*be, x, xv.data());
    upload_f32(*be, r, rv.data());
    if (p > 0) {
      probs = {p, 11, 1};
      resid_a = {p, 11, 2};
      resid_m = {p, 11, 3};
    }
  }
  BlockPass pass() const {
    return {*be, be->default_stream(), saved.block(0), scratch, probs, resid_a, resid_m,
            saved.rerun_block(), saved.recompute_cheap(), Tensor()};
  }
  double loss() {
    block.forward(pass(), x, out);
    const auto o = host(*be, out), rv = host(*be, r);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += double(o[i]) * rv[i];
    return l;
  }
  // Gradients of x (returned) and of the parameters (in bound.grads).
  std::vector<float> grad() {
    be->fill(be->default_stream(), bound.grads, 0.f);
    block.forward(pass(), x, out);
    be->copy(be->default_stream(), dres, r);
    block.backward(pass(), dres, x, out);
    return host(*be, dres);
  }
};

TEST(TransformerBlock, BackwardMatchesFiniteDifferences) {
  for (float p : {0.f, 0.2f}) {
    BlockRig rig(ActivationCheckpointing::None, p, 17);
    const auto dx = rig.grad();
    const auto dw = host(*rig.be, rig.bound.grads);
    auto fd = [&](const Tensor& buf, size_t i) {
      auto v = host(*rig.be, buf);
      const float h = 1e-2f, v0 = v[i];
      v[i] = v0 + h;
      upload_f32(*rig.be, buf, v.data());
      const double lp = rig.loss();
      v[i] = v0 - h;
      upload_f32(*rig.be, buf, v.data());
      const double lm = rig.loss();
      v[i] = v0;
      upload_f32(*rig.be, buf, v.data());
      return (lp - lm) / (2 * h);
    };
    auto check = [&](double want, double got, const std::string& what) {
      const double err = std::abs(want - got) / std::max(5e-2, std::abs(want) + std::abs(got));  // fp32 noise floor
      EXPECT_LT(err, 2e-2) << what << ": finite difference " << want << ", backward " << got
                           << ", dropout " << p;
    };
    for (size_t i = 0; i < dx.size(); i += 13) check(fd(rig.x, i), dx[i], "dx[" + std::to_string(i) + "]");
    for (size_t k = 0; k < rig.params.size(); ++k) {
      const int64_t n = rig.params[k]->shape.numel();
      for (int64_t j : {int64_t{0}, n / 2, n - 1}) {
        const size_t i = static_cast<size_t>(rig.bound.offsets[k] + j);
        check(fd(rig.bound.values, i), dw[i], rig.params[k]->name + "[" + std::to_string(j) + "]");
      }
    }
  }
}

TEST(TransformerBlock, CheckpointingPoliciesGiveBitwiseEqualGradients) {
  std::vector<float> ref_dx, ref_dw;
  for (auto mode : {ActivationCheckpointing::None, ActivationCheckpointing::Selective,
                    ActivationCheckpointing::Full}) {
    BlockRig rig(mode, 0.1f, 23);
    const auto dx = rig.grad();
    const auto dw = host(*rig.be, rig.bound.grads);
    if (mode == ActivationCheckpointing::None) {
      ref_dx = dx, ref_dw = dw;
      EXPECT_FALSE(rig.saved.rerun_block() || rig.saved.recompute_cheap());
      continue;
    }
    EXPECT_EQ(dx, ref_dx) << "mode " << int(mode);
    EXPECT_EQ(dw, ref_dw) << "mode " << int(mode);
    EXPECT_EQ(rig.saved.rerun_block(), mode == ActivationCheckpointing::Full);
    EXPECT_TRUE(rig.saved.recompute_cheap());
  }
}

TEST(SavedActivations, PolicyKeepsByRecomputeClass) {
  using A = ActivationCheckpointing;
  using R = Recompute;
  EXPECT_TRUE(keeps(A::None, R::Cheap) && keeps(A::None, R::WithBlock) && keeps(A::None, R::Never));
  EXPECT_TRUE(!keeps(A::Selective, R::Cheap) && keeps(A::Selective, R::WithBlock));
  EXPECT_TRUE(!keeps(A::Full, R::Cheap) && !keeps(A::Full, R::WithBlock) && keeps(A::Full, R::Never));
  EXPECT_THROW(parse_activation_checkpointing("some"), Error);
  // Full: blocks share every saved tensor (one block's worth in all).
  auto be = make_backend("cpu");
  TransformerBlock b("h.", awkward_spec());
  int64_t bytes[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const A mode = k == 0 ? A::None : A::Full;
    SavedActivations s;
    const int64_t before = be->allocator().stats().current_of(MemCategory::Activations);
    s.reserve(*be, b.saved_specs(2, 7, DType::F32), 4, mode);
    bytes[k] = be->allocator().stats().current_of(MemCategory::Activations) - before;
    EXPECT_EQ(s.block(0)[0].data<float>() == s.block(3)[0].data<float>(), mode == A::Full);
  }
  EXPECT_EQ(bytes[0], 4 * bytes[1]);  // 4 blocks of their own against one shared
}

TEST(Param, InitialValuesDependOnGlobalCoordinatesOnly) {
  Param p("w", Shape{7, 9}, Init::normal(0.5f), true);
  p.init.zero_rows_from = 5;
  const auto whole = init_values(p, 3, 4, 0, 63);
  for (int64_t b : {0, 1, 10, 44}) {
    for (int64_t e : {b, b + 3, int64_t{63}}) {
      const auto piece = init_values(p, 3, 4, b, e);
      ASSERT_EQ(piece, std::vector<float>(whole.begin() + b, whole.begin() + e)) << b << ".." << e;
    }
  }
  for (int64_t i = 45; i < 63; ++i) EXPECT_EQ(whole[static_cast<size_t>(i)], 0.f);
  EXPECT_NE(whole[0], init_values(p, 3, 5, 0, 1)[0]);  // another stream
  EXPECT_THROW(init_values(p, 3, 4, 10, 64), Error);
}

TEST(AttentionSpec, ImpossibleShapesAreAClearError) {
  AttentionSpec a;
  a.n_head = 4;
  a.head_dim = 8;
  EXPECT_NO_THROW(a.check());
  EXPECT_EQ(a.qkv_width(), 96);
  a.n_kv_head = 2;  // grouped-query attention
  EXPECT_EQ(a.qkv_width(), 64);
  EXPECT_NO_THROW(a.check());
  a.n_kv_head = 3;  // 4 query heads cannot share 3 key/value heads
  EXPECT_THROW(a.check(), Error);
  a.n_kv_head = 0;
  a.head_dim = 7;
  a.rotary = true;  // rotary pairs channels: HD must be even
  EXPECT_THROW(a.check(), Error);
}

// The fused classifier over 1-row, 3-row and whole chunks: the same loss sums (added on
// the device, one accumulator) and gradients up to rounding (oneDNN picks its GEMM
// kernel by the row count, so even dx, row by row, may differ in the last bit: seen on
// an AMD EPYC Zen 3); the chunk's rows from its size in MiB (a bad size a one-line error
// naming train.classifier_chunk_mb; a value of the wrong type is the config's error,
// tests/config/config_test.cpp).
TEST(Classifier, ChunkSizeDoesNotChangeTheResult) {
  auto be = make_backend("cpu");
  const Stream s = be->default_stream();
  const int64_t N = 11, C = 6, V = 29, Vp = 32;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(N * C), w(Vp * C);
  for (float& v : x) v = nd(rng);
  for (float& v : w) v = nd(rng);
  std::vector<int32_t> tgt(N);
  for (int64_t i = 0; i < N; ++i) tgt[i] = static_cast<int32_t>((i * 5 + 2) % V);
  tgt[4] = -1;
  auto f32 = [&](const std::vector<float>& h, Shape sh) {
    Tensor t = be->empty(sh, DType::F32, MemCategory::Activations);
    upload_f32(*be, t, h.data());
    return t;
  };
  Tensor tt = be->empty(Shape{N}, DType::I32, MemCategory::Activations);
  be->copy_from_host(s, tt, tgt.data());
  struct Out { double sum, count; std::vector<float> dx, dw; };
  auto run = [&](int64_t R) {
    Tensor dx = f32(std::vector<float>(N * C, 0.f), Shape{N, C});
    Tensor dw = f32(std::vector<float>(Vp * C, 0.f), Shape{Vp, C});
    Tensor acc = be->empty(Shape{2}, DType::F64, MemCategory::Activations);
    be->fill(s, acc, 0.f);
    classifier_cross_entropy(*be, s, f32(x, Shape{N, C}), f32(w, Shape{Vp, C}), tt,
                             static_cast<int>(V), 0.1f, dx, dw,
                             be->empty(Shape{R, Vp}, DType::F32, MemCategory::Activations),
                             be->empty(Shape{R}, DType::F32, MemCategory::Activations), acc);
    double h[2];
    be->copy_to_host(s, h, acc);
    return Out{h[0], h[1], host(*be, dx), host(*be, dw)};
  };
  const Out whole = run(N);
  EXPECT_EQ(whole.count, 10.0);
  EXPECT_GT(whole.sum, 0.0);
  for (int64_t R : {int64_t{1}, int64_t{3}}) {
    const Out o = run(R);
    EXPECT_EQ(o.count, whole.count);
    EXPECT_NEAR(o.sum, whole.sum, 1e-6 * whole.sum) << "R=" << R;
    for (size_t i = 0; i < o.dx.size(); ++i)  // row by row: no cross-chunk sums
      EXPECT_NEAR(o.dx[i], whole.dx[i], 1e-6f * (1.f + std::fabs(whole.dx[i]))) << "R=" << R << " dx " << i;
    for (size_t i = 0; i < o.dw.size(); ++i)
      EXPECT_NEAR(o.dw[i], whole.dw[i], 1e-5) << "R=" << R << " dwte " << i;
  }
  EXPECT_EQ(kDefaultClassifierChunkMb, 16.0);
  EXPECT_EQ(classifier_chunk_rows(100000, 50304, kDefaultClassifierChunkMb), 83);
  EXPECT_EQ(classifier_chunk_rows(100000, 50304, 256), 1334);
  EXPECT_EQ(classifier_chunk_rows(500, 50304, 256), 500);
  EXPECT_EQ(classifier_chunk_rows(100, 50304, 0.001), 1);
  for (const double bad : {0.0, -3.0, std::nan(""), HUGE_VAL}) {
    try {
      classifier_chunk_rows(10, 64, bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("train.classifier_chunk_mb"), std::string::npos);
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace kiln::nn

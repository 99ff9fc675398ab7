// The layer library on the CPU backend: a transformer block's backward against central
// differences of its forward (fp32, awkward sizes, dropout on; also Qwen3's attention:
// QK-norm, heads wider than C / NH), the three checkpointing policies giving bitwise the
// same gradients, QK-norm's forward against a double reference, the recompute classes,
// initial values by
// global element coordinates, the classifier's chunking (train.classifier_chunk_mb) not
// changing its result, and clear errors for what the backends cannot do yet.
#include "backend/registry.h"
#include "grad_check.h"
#include "nn/block.h"
#include "nn/classifier.h"
#include "nn/expert_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

namespace kiln::nn {
namespace {

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

// Qwen3's block at awkward sizes: RMSNorm, SwiGLU, no biases, rotary grouped-query
// attention (4 query heads over 2 key/value heads) of head size 6, so NH * HD = 24 is not
// C = 15, with QK-norm.
BlockSpec qk_norm_spec() {
  BlockSpec s = awkward_spec();
  s.norm = NormSpec{NormKind::RMSNorm, 1e-5f, true, false};
  s.attention.n_head = 4;
  s.attention.n_kv_head = 2;
  s.attention.head_dim = 6;
  s.attention.rotary = true;
  s.attention.qk_norm = true;
  s.attention.qk_norm_eps = 1e-5f;
  s.mlp = MlpKind::SwiGLU;
  s.bias = false;
  return s;
}

// One block, forward and backward, of L = sum(out * R) for a fixed random R.
struct BlockRig {
  std::unique_ptr<Backend> be = make_backend("cpu");
  TransformerBlock block;
  std::vector<Param*> params;
  Bound bound;
  SavedActivations saved;
  BlockScratch scratch;
  int B = 2, T = 7;
  Tensor x, out, dres, r;
  DropoutSpec probs, resid_a, resid_m;

  BlockRig(ActivationCheckpointing mode, float p, uint64_t seed,
           const BlockSpec& spec = awkward_spec())
      : block("h.0.", spec) {
    block.collect(params);
    bound = bind_params(*be, params);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    perturb_initial_values(*be, bound, params, rng);
    const int64_t C = spec.n_embd;
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

void check_finite_differences(const BlockSpec& spec, float p) {
  BlockRig rig(ActivationCheckpointing::None, p, 17, spec);
  const auto dx = rig.grad();
  const auto dw = host(*rig.be, rig.bound.grads);
  auto fd = [&](const Tensor& buf, size_t i) {
    return central_difference(*rig.be, buf, i, [&] { return rig.loss(); });
  };
  auto check = [&](double want, double got, const std::string& what) {
    EXPECT_LT(gradient_gap(want, got), 2e-2)
        << what << ": finite difference " << want << ", backward " << got << ", dropout " << p;
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

TEST(TransformerBlock, BackwardMatchesFiniteDifferences) {
  for (float p : {0.f, 0.2f}) check_finite_differences(awkward_spec(), p);
}

// QK-norm's gains and the projections around heads wider than C / NH, through rotary.
TEST(TransformerBlock, QkNormAndWideHeadsMatchFiniteDifferences) {
  check_finite_differences(qk_norm_spec(), 0.1f);
}

void check_checkpointing_bitwise(const BlockSpec& spec) {
  std::vector<float> ref_dx, ref_dw;
  for (auto mode : {ActivationCheckpointing::None, ActivationCheckpointing::Selective,
                    ActivationCheckpointing::Full}) {
    BlockRig rig(mode, 0.1f, 23, spec);
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

TEST(TransformerBlock, CheckpointingPoliciesGiveBitwiseEqualGradients) {
  check_checkpointing_bitwise(awkward_spec());
  check_checkpointing_bitwise(qk_norm_spec());
}

// A double reference of Qwen3's attention as transformers computes it, for B sequences
// of T positions (0..T-1) of C channels, NH query heads over NKV key/value heads of HD.
struct RefAttention {
  int64_t B, T, C, NH, NKV, HD;
  int64_t width() const { return (NH + 2 * NKV) * HD; }

  // q, k, v rows [B*T, width] = x @ wqkv^T, then each q head and k head RMS-normalised
  // over its HD channels with its kind's gain (eps), THEN rotated (rotate-half).
  std::vector<double> qkv(const std::vector<float>& x, const float* wqkv, const float* gain[2],
                          double eps, const std::vector<float>& inv_freq) const {
    const int64_t W = width();
    std::vector<double> out(static_cast<size_t>(B * T * W));
    for (int64_t n = 0; n < B * T; ++n) {
      double* row = &out[static_cast<size_t>(n * W)];
      for (int64_t j = 0; j < W; ++j)
        for (int64_t c = 0; c < C; ++c) row[j] += double{wqkv[j * C + c]} * x[static_cast<size_t>(n * C + c)];
      for (int64_t h = 0; h < NH + NKV; ++h) {
        double* v = row + h * HD;
        double ms = 0;
        for (int64_t i = 0; i < HD; ++i) ms += v[i] * v[i] / static_cast<double>(HD);
        for (int64_t i = 0; i < HD; ++i) v[i] *= gain[h < NH ? 0 : 1][i] / std::sqrt(ms + eps);
        for (int64_t i = 0; i < HD / 2; ++i) {
          const double a = static_cast<double>(n % T) * inv_freq[static_cast<size_t>(i)];
          const double x1 = v[i], x2 = v[i + HD / 2];
          v[i] = x1 * std::cos(a) - x2 * std::sin(a);
          v[i + HD / 2] = x2 * std::cos(a) + x1 * std::sin(a);
        }
      }
    }
    return out;
  }

  // Causal grouped-query softmax attention of those rows: [B*T, NH*HD].
  std::vector<double> attend(const std::vector<double>& qkv) const {
    const int64_t W = width();
    auto at = [&](int64_t b, int64_t t, int64_t head) { return &qkv[static_cast<size_t>((b * T + t) * W + head * HD)]; };
    std::vector<double> out(static_cast<size_t>(B * T * NH * HD));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t t = 0; t < T; ++t) {
          const int64_t kh = NH + h / (NH / NKV), vh = kh + NKV;
          std::vector<double> p(static_cast<size_t>(t + 1));
          double sum = 0;
          for (int64_t j = 0; j <= t; ++j) {
            double d = 0;
            for (int64_t i = 0; i < HD; ++i) d += at(b, t, h)[i] * at(b, j, kh)[i];
            sum += (p[static_cast<size_t>(j)] = std::exp(d / std::sqrt(double(HD))));
          }
          for (int64_t j = 0; j <= t; ++j)
            for (int64_t i = 0; i < HD; ++i)
              out[static_cast<size_t>((b * T + t) * NH * HD + h * HD + i)] += p[static_cast<size_t>(j)] / sum * at(b, j, vh)[i];
        }
    return out;
  }
};

// QK-norm's forward against RefAttention: heads of 6 over C = 7 (NH * HD = 24), grouped
// query, gains that are not ones; then the output projection.
TEST(SelfAttention, QkNormForwardMatchesADoubleReference) {
  auto be = make_backend("cpu");
  const RefAttention ref{2, 5, 7, 4, 2, 6};
  AttentionSpec spec;
  spec.n_head = 4, spec.n_kv_head = 2, spec.head_dim = 6, spec.rotary = true;
  spec.rope.theta = 100.0;  // fast turns over 5 positions
  spec.qk_norm = true, spec.qk_norm_eps = 1e-3f;
  SelfAttention attn("a.qkv", "a.o", ref.C, spec, /*bias=*/false, 0.5f, 0.5f, "a.q_norm", "a.k_norm");
  std::vector<Param*> params;
  attn.collect(params);
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[1]->name, "a.q_norm.weight");
  EXPECT_EQ(params[2]->shape, Shape{6});
  EXPECT_FALSE(params[1]->weight_decay);
  const Bound bound = bind_params(*be, params);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 0.7f);
  std::vector<float> w(static_cast<size_t>(bound.values.numel())), x(static_cast<size_t>(ref.B * ref.T * ref.C));
  for (auto& v : w) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  upload_f32(*be, bound.values, w.data());
  const Shape act{ref.B, ref.T, ref.C};
  Tensor inp = be->empty(act, DType::F32, MemCategory::Activations);
  Tensor out = be->empty(act, DType::F32, MemCategory::Activations);
  upload_f32(*be, inp, x.data());
  std::vector<Tensor> saved;
  for (const SavedSpec& sp : attn.saved_specs(ref.B, ref.T, DType::F32))
    saved.push_back(be->empty(sp.shape, sp.dtype, MemCategory::Activations));
  ASSERT_EQ(saved.size(), attn.num_saved());
  attn.forward(*be, be->default_stream(), saved, out, inp, Tensor(), Tensor(), DropoutSpec{});
  const auto got = host(*be, out);

  const float* gain[2] = {w.data() + bound.offsets[1], w.data() + bound.offsets[2]};
  const auto att = ref.attend(ref.qkv(x, w.data() + bound.offsets[0], gain, spec.qk_norm_eps, rope_inv_freq(spec.rope, 6)));
  const float* wo = w.data() + bound.offsets[3];
  const int64_t Q = ref.NH * ref.HD;
  for (int64_t n = 0; n < ref.B * ref.T; ++n)
    for (int64_t c = 0; c < ref.C; ++c) {
      double want = 0;
      for (int64_t j = 0; j < Q; ++j) want += double{wo[c * Q + j]} * att[static_cast<size_t>(n * Q + j)];
      EXPECT_NEAR(got[static_cast<size_t>(n * ref.C + c)], want, 1e-4 * std::max(1.0, std::abs(want)))
          << "row " << n << " channel " << c;
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

// The dispatch bookkeeping of every rank of ep groups, on random counts with empty
// experts and ranks: each rank's rows arrive where its peer expects them, and reordered
// by to_expert_order they lie by local expert, then source rank, then slot, each expert
// within its offsets.
TEST(EpDispatch, EveryRowReachesItsExpertInSourceOrder) {
  std::mt19937 gen(7);
  // A row: (source rank, global expert, slot index within the source's expert).
  struct Row {
    int src;
    int64_t expert;
    int i;
    bool operator==(const Row&) const = default;
  };
  for (int ep : {1, 2, 3, 4}) {
    const int64_t El = 3, E = ep * El;
    std::vector<std::vector<int32_t>> own(static_cast<size_t>(ep));  // [rank][expert]
    for (auto& c : own)
      for (int64_t e = 0; e < E; ++e) c.push_back(gen() % 4 == 0 ? 0 : static_cast<int32_t>(gen() % 5));
    own[0].assign(static_cast<size_t>(E), 0);  // a rank with nothing routed
    auto count = [&](int s, int64_t e) { return own[static_cast<size_t>(s)][static_cast<size_t>(e)]; };
    for (int q = 0; q < ep; ++q) {
      std::vector<int32_t> incoming;  // what the counts' all_to_all delivers
      for (int s = 0; s < ep; ++s)
        for (int64_t j = 0; j < El; ++j) incoming.push_back(count(s, q * El + j));
      const EpDispatch d = make_ep_dispatch(own[static_cast<size_t>(q)], incoming, ep, q);
      std::vector<Row> received;  // what the rows' all_to_all delivers: by source
      for (int s = 0; s < ep; ++s) {
        const std::vector<int32_t> any(incoming.size());
        const EpDispatch from = make_ep_dispatch(own[static_cast<size_t>(s)], any, ep, s);
        ASSERT_EQ(d.recv_rows[static_cast<size_t>(s)], from.send_rows[static_cast<size_t>(q)]);
        for (int64_t j = 0; j < El; ++j)
          for (int i = 0; i < count(s, q * El + j); ++i) received.push_back({s, q * El + j, i});
      }
      ASSERT_EQ(d.received(), static_cast<int64_t>(received.size()));
      ASSERT_EQ(d.to_expert_order.size(), received.size());
      std::vector<Row> by_expert(received.size(), Row{-1, -1, -1});
      for (size_t r = 0; r < received.size(); ++r)
        by_expert[static_cast<size_t>(d.to_expert_order[r])] = received[r];
      std::vector<Row> expect;  // by local expert, then source, then slot
      for (int64_t j = 0; j < El; ++j) {
        EXPECT_EQ(d.offsets[static_cast<size_t>(j)], static_cast<int32_t>(expect.size()));
        for (int s = 0; s < ep; ++s)
          for (int i = 0; i < count(s, q * El + j); ++i) expect.push_back({s, q * El + j, i});
      }
      EXPECT_EQ(by_expert, expect) << "ep " << ep << " rank " << q;
    }
  }
  using Counts = std::vector<int32_t>;
  EXPECT_THROW(make_ep_dispatch(Counts(5, 1), Counts(5, 1), 2, 0), Error);  // 2 does not divide 5
  EXPECT_THROW(make_ep_dispatch(Counts(4, 1), Counts(3, 1), 2, 0), Error);  // 3 incoming, not 4
  EXPECT_THROW(make_ep_dispatch(Counts{1, -1}, Counts{1}, 2, 1), Error);    // negative
}

// The overlap's chunk split: chunk 0 takes the first ceil(n / 2) rows of each run of El
// counts, expert by expert, so that the sender (its counts per destination) and the
// receiver (its counts per source) cut every piece at the same row.
TEST(EpDispatch, FirstChunkTakesTheFirstHalfOfEachPiece) {
  using Counts = std::vector<int32_t>;
  // Runs of 3: {2, 0, 3} (5 rows: 3 in chunk 0), {0, 0, 0}, {1, 1, 1} (2), {4, 0, 0} (2).
  EXPECT_EQ(ep_first_chunk(Counts{2, 0, 3, 0, 0, 0, 1, 1, 1, 4, 0, 0}, 3),
            (Counts{2, 0, 1, 0, 0, 0, 1, 1, 0, 2, 0, 0}));
  EXPECT_EQ(ep_first_chunk(Counts{1}, 1), (Counts{1}));  // one row: chunk 0 has it
}

}  // namespace
}  // namespace kiln::nn

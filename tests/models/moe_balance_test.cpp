// The balancing groups of MoeBalance (models/moe_balance.h) on the CPU backend: two ranks'
// N = 7 tokens through two MoE layers' routers (E = 5, k = 2), the group played by a fake
// that adds the other rank's counts (as a two-rank all-reduce would).
//   - The "global" scope over two data-parallel ranks' micro-batches: the mean of the
//     ranks' aux (what the trainer reports) equals the micro_batch formula over the 14
//     concatenated tokens, and each rank's router gradients at grad scale 1/2 (the
//     trainer's 1 / (grad_accum dp), summed over the ranks) are the concatenated run's rows.
//   - Context parallelism: the two ranks hold halves of one micro-batch of 14 tokens
//     (micro_batch scope over the cp group): the same figures, at grad scale 1 (dp = 1).
// Both auxiliary-loss forms, both scorings, the z-loss on. Without a group (one rank) the
// global scope is the micro_batch scope bit for bit. A pipeline stage's chunks (layers
// [0, 1) and [1, 2) as two forwards) add up to the whole. The trainer-level tests are in
// tests/parallel/moe_train_test.sh and moe_pp_cp_train_test.sh.
#include "backend/registry.h"
#include "core/error.h"
#include "models/moe_balance.h"
#include "nn/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

namespace kiln {
namespace {

constexpr int kL = 2, kE = 5, kK = 2, kN = 7, kC = 3;

using Floats = std::vector<float>;

struct Case {
  MoeBalanceSpec::AuxType type;
  MoeScoring scoring;
};

/// The counts a rank's forward leaves before the all-reduce: [L + 1, E], row L their sum.
Floats counts_of(const std::vector<std::vector<int32_t>>& idx) {
  Floats c((kL + 1) * kE, 0.f);
  for (int m = 0; m < kL; ++m)
    for (int32_t e : idx[m]) {
      c[m * kE + e] += 1.f;
      c[kL * kE + e] += 1.f;
    }
  return c;
}

/// A two-rank group seen from one rank: the sum adds the other rank's tensor.
class FakeGroup final : public MoeBalanceGroup {
 public:
  FakeGroup(Backend& be, Floats other) : be_(be), other_(std::move(other)) {}
  int size() const override { return 2; }
  void all_reduce_sum(Stream s, const Tensor& t) override {
    Floats v(static_cast<size_t>(t.numel()));
    ASSERT_EQ(v.size(), other_.size());
    be_.copy_to_host(s, v.data(), t);
    for (size_t i = 0; i < v.size(); ++i) v[i] += other_[i];
    be_.copy_from_host(s, t, v.data());
    ++calls;
  }
  int calls = 0;

 private:
  Backend& be_;
  Floats other_;
};

struct Result {
  double aux = 0, z = 0;
  std::vector<Floats> dlogits;  // per layer [N, E]
  std::vector<std::vector<double>> tokens;
};

class GlobalScope : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_backend("cpu");

  /// Layer m's logits [rows, E] and top-k choice of the tokens [first, first + rows) of
  /// the concatenation.
  struct Routed {
    Tensor logits, idx;
    std::vector<int32_t> host_idx;
  };
  Routed route(const Case& c, int m, int first, int rows) {
    Routed r;
    r.logits = be->empty(Shape{rows, kE}, DType::F32, MemCategory::Activations);
    r.idx = be->empty(Shape{rows, kK}, DType::I32, MemCategory::Activations);
    Tensor scores = be->empty(Shape{rows, kE}, DType::F32, MemCategory::Activations);
    Tensor weight = be->empty(Shape{rows, kK}, DType::F32, MemCategory::Activations);
    be->copy_from_host(be->default_stream(), r.logits, logits_[m].data() + first * kE);
    be->moe_router_forward(be->default_stream(), scores, r.idx, weight, r.logits, Tensor(),
                           MoeRouterSpec{c.scoring, kK, true});
    r.host_idx.resize(static_cast<size_t>(rows * kK));
    be->copy_to_host(be->default_stream(), r.host_idx.data(), r.idx);
    return r;
  }

  /// One forward and backward of the balancing losses over tokens [first, first + rows),
  /// the balancing groups `micro` (cp) and `global_group` (dp x cp); with `chunked`, the
  /// two layers as two pipeline chunks (each its own forward).
  Result run(const Case& c, bool global, MoeBalanceGroup* micro, MoeBalanceGroup* global_group,
             float grad_scale, int first, int rows, bool chunked = false) {
    nn::MoeSpec ms{.num_experts = kE, .top_k = kK, .expert_hidden = 4, .scoring = c.scoring};
    std::vector<std::unique_ptr<nn::MoeMlp>> owned;
    std::vector<nn::MoeMlp*> layers;
    for (int m = 0; m < kL; ++m) {
      owned.push_back(std::make_unique<nn::MoeMlp>("l" + std::to_string(m), kC, ms, 0.02f, 0.02f));
      layers.push_back(owned.back().get());
    }
    MoeBalance bal(*be, MoeBalanceSpec{.aux_coef = 0.01f, .aux_type = c.type, .z_coef = 0.001f,
                                       .global = global},
                   layers);
    bal.set_groups(micro, global_group);
    bal.set_grad_scale(grad_scale);
    const Stream s = be->default_stream();
    std::vector<Routed> routed;
    std::vector<MoeMicroStats> mbs;  // one per chunk
    for (int m = 0; m < kL; ++m) {
      if (m == 0 || chunked) {
        mbs.push_back(bal.micro_stats());
        bal.begin_forward(mbs.back(), rows, m, chunked ? m + 1 : kL, m == 0);
      }
      routed.push_back(route(c, m, first, rows));
      const nn::MoeBalancePass p = bal.pass(mbs.back(), m);
      be->moe_balance_stats(s, p.load, p.prob, p.z, routed[m].logits, routed[m].idx, c.scoring,
                            p.prob_scale, p.z_scale);
      if (m == kL - 1 || chunked) bal.end_forward(mbs.back());
    }
    Result out;
    for (int m = 0; m < kL; ++m) {
      const nn::MoeBalancePass p = bal.pass(mbs[chunked ? m : 0], m);
      Tensor d = be->empty(Shape{rows, kE}, DType::F32, MemCategory::Activations);
      be->fill(s, d, 0.f);
      be->moe_balance_backward(s, d, routed[m].logits, p.grad_load, c.scoring, p.aux_grad_scale,
                               p.z_grad_scale);
      out.dlogits.emplace_back(static_cast<size_t>(rows * kE));
      be->copy_to_host(s, out.dlogits.back().data(), d);
    }
    const MoeStats st = bal.take();
    out.aux = st.aux_loss;
    out.z = st.z_loss;
    out.tokens = st.tokens_per_expert;
    return out;
  }

  /// The counts of rank `r`'s tokens, as its forward leaves them.
  Floats rank_counts(const Case& c, int r) {
    std::vector<std::vector<int32_t>> idx;
    for (int m = 0; m < kL; ++m) idx.push_back(route(c, m, r * kN, kN).host_idx);
    return counts_of(idx);
  }

  void SetUp() override {
    std::mt19937 g(38);
    std::normal_distribution<float> nd(0.f, 1.5f);
    for (auto& l : logits_) {
      l.resize(2 * kN * kE);
      for (float& v : l) v = nd(g);
    }
  }
  Floats logits_[kL];  // per layer [2N, E]: rank 0's tokens, then rank 1's
};

TEST_F(GlobalScope, TwoRanksGiveTheMicroBatchLossOfTheirConcatenatedTokens) {
  for (const Case c : {Case{MoeBalanceSpec::AuxType::PerLayer, MoeScoring::Softmax},
                       Case{MoeBalanceSpec::AuxType::Hf, MoeScoring::Softmax},
                       Case{MoeBalanceSpec::AuxType::PerLayer, MoeScoring::Sigmoid}}) {
    SCOPED_TRACE(c.type == MoeBalanceSpec::AuxType::Hf ? "hf" : c.scoring == MoeScoring::Sigmoid
                                                                     ? "per_layer sigmoid"
                                                                     : "per_layer softmax");
    const Result cat = run(c, false, nullptr, nullptr, 1.f, 0, 2 * kN);
    double aux = 0, z = 0;
    for (int r = 0; r < 2; ++r) {
      FakeGroup group(*be, rank_counts(c, 1 - r));
      const Result got = run(c, true, nullptr, &group, 0.5f, r * kN, kN);
      EXPECT_EQ(group.calls, 1);
      aux += got.aux / 2;  // the trainer reports the mean over the ranks
      z += got.z / 2;
      // The step's tokens per expert stay the rank's own (the trainer sums them).
      const Floats own = rank_counts(c, r);
      for (int m = 0; m < kL; ++m)
        for (int e = 0; e < kE; ++e) EXPECT_EQ(got.tokens[m][e], own[m * kE + e]);
      for (int m = 0; m < kL; ++m)
        for (int i = 0; i < kN * kE; ++i)
          EXPECT_NEAR(got.dlogits[m][i], cat.dlogits[m][r * kN * kE + i], 1e-7)
              << "layer " << m << " rank " << r << " element " << i;
    }
    EXPECT_GT(cat.aux, 0.0);
    EXPECT_NEAR(aux, cat.aux, 1e-6 * cat.aux);
    EXPECT_NEAR(z, cat.z, 1e-6 * cat.z);
  }
}

TEST_F(GlobalScope, OneRankIsTheMicroBatchScopeBitwise) {
  for (const auto type : {MoeBalanceSpec::AuxType::PerLayer, MoeBalanceSpec::AuxType::Hf}) {
    const Case c{type, MoeScoring::Softmax};
    const Result a = run(c, false, nullptr, nullptr, 0.25f, 0, kN);
    const Result b = run(c, true, nullptr, nullptr, 0.25f, 0, kN);
    EXPECT_EQ(a.aux, b.aux);
    EXPECT_EQ(a.z, b.z);
    EXPECT_EQ(a.dlogits, b.dlogits);
  }
}

// Context parallelism: each cp rank holds half of the micro-batch's tokens; the micro_batch
// scope balances over the cp group. dp = 1, so the trainer's grad scale is 1 / grad_accum.
TEST_F(GlobalScope, ContextParallelRanksGiveTheirMicroBatchsLoss) {
  for (const Case c : {Case{MoeBalanceSpec::AuxType::PerLayer, MoeScoring::Softmax},
                       Case{MoeBalanceSpec::AuxType::Hf, MoeScoring::Softmax},
                       Case{MoeBalanceSpec::AuxType::PerLayer, MoeScoring::Sigmoid}}) {
    SCOPED_TRACE(c.type == MoeBalanceSpec::AuxType::Hf ? "hf" : "per_layer");
    const Result cat = run(c, false, nullptr, nullptr, 0.5f, 0, 2 * kN);
    double aux = 0, z = 0;
    std::vector<double> tokens(kL * kE, 0.0);
    for (int r = 0; r < 2; ++r) {
      FakeGroup cp(*be, rank_counts(c, 1 - r));
      const Result got = run(c, false, &cp, nullptr, 0.5f, r * kN, kN);
      EXPECT_EQ(cp.calls, 1);
      aux += got.aux / 2;  // the trainer's mean over the dp x cp ranks
      z += got.z / 2;
      for (int m = 0; m < kL; ++m)
        for (int e = 0; e < kE; ++e) tokens[m * kE + e] += got.tokens[m][e];
      for (int m = 0; m < kL; ++m)
        for (int i = 0; i < kN * kE; ++i)
          EXPECT_NEAR(got.dlogits[m][i], cat.dlogits[m][r * kN * kE + i], 1e-7)
              << "layer " << m << " rank " << r << " element " << i;
    }
    EXPECT_NEAR(aux, cat.aux, 1e-6 * cat.aux);
    EXPECT_NEAR(z, cat.z, 1e-6 * cat.z);
    for (int m = 0; m < kL; ++m)  // the rank's own counts: summed, no token twice
      for (int e = 0; e < kE; ++e) EXPECT_EQ(tokens[m * kE + e], cat.tokens[m][e]);
  }
}

// Pipeline chunks: the layers' statistics in two forwards (two slots) add up to the
// whole model's, the counted micro-batch once.
TEST_F(GlobalScope, PipelineChunksAddUpToTheWholeModel) {
  const Case c{MoeBalanceSpec::AuxType::PerLayer, MoeScoring::Softmax};
  const Result whole = run(c, false, nullptr, nullptr, 0.25f, 0, kN);
  const Result chunks = run(c, false, nullptr, nullptr, 0.25f, 0, kN, true);
  EXPECT_NEAR(chunks.aux, whole.aux, 1e-7 * whole.aux);
  EXPECT_EQ(chunks.z, whole.z);
  EXPECT_EQ(chunks.tokens, whole.tokens);
  EXPECT_EQ(chunks.dlogits, whole.dlogits);
  // The hf form couples the layers: refused on a chunk of them.
  EXPECT_THROW(run(Case{MoeBalanceSpec::AuxType::Hf, MoeScoring::Softmax}, false, nullptr,
                   nullptr, 0.25f, 0, kN, true),
               Error);
}

}  // namespace
}  // namespace kiln

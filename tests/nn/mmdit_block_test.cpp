// The MMDiT block (nn/mmdit_block.h: two adaLN-Zero streams meeting in a joint attention)
// on the CPU backend, at awkward sizes (C = 12 in 3 heads, MLP 19, 5 image and 4 context
// tokens), every weight random (adaLN-Zero's zeros would hide most gradients):
//   - backward against central differences of forward, for the image and context inputs,
//     the conditioning and every parameter, with and without documents (a caption's
//     padding cut off) and with a pre-only context;
//   - the three checkpointing policies give bitwise the same gradients;
//   - with documents, the padding's values change nothing of the other tokens' outputs
//     or gradients.
#include "backend/registry.h"
#include "grad_check.h"
#include "nn/mmdit_block.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kiln::nn {
namespace {

constexpr int64_t kB = 2, kTx = 5, kTc = 4, kC = 12;
// Sequence 1's caption has 2 real tokens: its last 2 context rows are padding.
constexpr int64_t kReal[kB] = {kTc, 2};

MMDiTBlockSpec spec_of(bool pre_only) {
  MMDiTBlockSpec s;
  s.n_embd = kC;
  s.attention.n_head = 3;
  s.attention.n_kv_head = 3;
  s.attention.head_dim = 4;
  s.attention.causal = false;
  s.mlp_hidden = 19;
  s.init_std = 0.3f;
  s.context_pre_only = pre_only;
  return s;
}

std::vector<float> host(Backend& be, const Tensor& t) { return download_f32(be, t); }

// One block, forward and backward, of L = sum(out_x * Rx) + sum(out_c * Rc) (no out_c
// term when pre-only) for fixed random Rx, Rc.
struct Rig {
  std::unique_ptr<Backend> be = make_backend("cpu");
  bool pre_only;
  MMDiTBlock block;
  std::vector<Param*> params;
  Bound bound;
  std::vector<std::vector<SavedSpec>> specs;
  SavedActivations saved;
  MMDiTScratch scratch;
  Tensor x, c, out_x, out_c, dres_x, dres_c, rx, rc, cond, dcond, cu;

  Rig(ActivationCheckpointing mode, bool pre_only_, bool documents, uint64_t seed)
      : pre_only(pre_only_), block("joint_blocks.0.", spec_of(pre_only_)) {
    block.collect(params);
    bound = bind_params(*be, params);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    perturb_initial_values(*be, bound, params, rng);
    saved.reserve(*be, {block.saved_specs(kB, kTx, kTc, DType::F32)}, mode);
    scratch = block.make_scratch(*be, kB, kTx, kTc, DType::F32);
    auto random = [&](Shape shape) {
      Tensor t = be->empty(shape, DType::F32, MemCategory::Activations);
      std::vector<float> v(static_cast<size_t>(shape.numel()));
      for (auto& e : v) e = nd(rng);
      upload_f32(*be, t, v.data());
      return t;
    };
    x = random({kB, kTx, kC}), c = random({kB, kTc, kC}), rx = random({kB, kTx, kC});
    rc = random({kB, kTc, kC}), cond = random({kB, kC});
    out_x = random({kB, kTx, kC}), out_c = random({kB, kTc, kC});
    dres_x = random({kB, kTx, kC}), dres_c = random({kB, kTc, kC}), dcond = random({kB, kC});
    if (documents) {
      // Per sequence: its image and real caption tokens, then its padding (maybe none).
      std::vector<int32_t> v{0};
      for (int64_t b = 0; b < kB; ++b) {
        v.push_back(static_cast<int32_t>(b * (kTx + kTc) + kTx + kReal[b]));
        v.push_back(static_cast<int32_t>((b + 1) * (kTx + kTc)));
      }
      cu = be->empty(Shape{static_cast<int64_t>(v.size())}, DType::I32, MemCategory::Activations);
      be->copy_from_host(be->default_stream(), cu, v.data());
    }
  }
  MMDiTPass pass() const {
    return {*be, be->default_stream(), saved.block(0), scratch, cond, dcond, cu,
            saved.rerun_block(), saved.recompute_cheap()};
  }
  double loss() {
    block.forward(pass(), x, c, out_x, out_c);
    double l = 0;
    auto dot = [&](const Tensor& a, const Tensor& b) {
      const auto av = host(*be, a), bv = host(*be, b);
      for (size_t i = 0; i < av.size(); ++i) l += double(av[i]) * bv[i];
    };
    dot(out_x, rx);
    if (!pre_only) dot(out_c, rc);
    return l;
  }
  // Gradients of the parameters (bound.grads), x (dres_x), c (dres_c) and cond (dcond).
  void grad() {
    const Stream s = be->default_stream();
    be->fill(s, bound.grads, 0.f);
    be->fill(s, dcond, 0.f);
    block.forward(pass(), x, c, out_x, out_c);
    be->copy(s, dres_x, rx);
    if (pre_only) {
      be->fill(s, dres_c, 0.f);
    } else {
      be->copy(s, dres_c, rc);
    }
    block.backward(pass(), dres_x, dres_c, x, c, out_x, out_c);
  }
};

void check_finite_differences(bool pre_only, bool documents) {
  Rig rig(ActivationCheckpointing::None, pre_only, documents, 17);
  rig.grad();
  const auto dx = host(*rig.be, rig.dres_x), dc = host(*rig.be, rig.dres_c);
  const auto dcond = host(*rig.be, rig.dcond), dw = host(*rig.be, rig.bound.grads);
  auto fd = [&](const Tensor& buf, size_t i) {
    return central_difference(*rig.be, buf, i, [&] { return rig.loss(); });
  };
  const std::string where = std::string(pre_only ? "pre-only" : "full") +
                            (documents ? ", documents" : "");
  auto check = [&](double want, double got, const std::string& what) {
    EXPECT_LT(gradient_gap(want, got), 2e-2)
        << what << " (" << where << "): finite difference " << want << ", backward " << got;
  };
  for (size_t i = 0; i < dx.size(); i += 7) check(fd(rig.x, i), dx[i], "dx[" + std::to_string(i) + "]");
  for (size_t i = 0; i < dc.size(); i += 5) check(fd(rig.c, i), dc[i], "dc[" + std::to_string(i) + "]");
  for (size_t i = 0; i < dcond.size(); i += 3)
    check(fd(rig.cond, i), dcond[i], "dcond[" + std::to_string(i) + "]");
  for (size_t k = 0; k < rig.params.size(); ++k) {
    const int64_t n = rig.params[k]->shape.numel();
    for (int64_t j : {int64_t{0}, n / 2, n - 1}) {
      const size_t i = static_cast<size_t>(rig.bound.offsets[k] + j);
      check(fd(rig.bound.values, i), dw[i], rig.params[k]->name + "[" + std::to_string(j) + "]");
    }
  }
}

TEST(MMDiTBlock, BackwardMatchesFiniteDifferences) {
  check_finite_differences(/*pre_only=*/false, /*documents=*/false);
  check_finite_differences(false, true);
  check_finite_differences(true, true);
}

TEST(MMDiTBlock, ParametersAreNamedAsSd3s) {
  for (bool pre_only : {false, true}) {
    MMDiTBlock block("joint_blocks.3.", spec_of(pre_only));
    std::vector<Param*> params;
    block.collect(params);
    std::vector<std::string> names;
    for (const Param* p : params) names.push_back(p->name);
    std::vector<std::string> want;
    for (const char* stream : {"x_block.", "context_block."}) {
      const bool full = std::string(stream) == "x_block." || !pre_only;
      std::vector<std::string> layers{"attn.qkv"};
      if (full) layers.insert(layers.end(), {"attn.proj", "mlp.fc1", "mlp.fc2"});
      layers.push_back("adaLN_modulation.1");
      for (const auto& l : layers)
        for (const char* wb : {".weight", ".bias"})
          want.push_back(std::string("joint_blocks.3.") + stream + l + wb);
    }
    EXPECT_EQ(names, want) << "pre_only " << pre_only;
    EXPECT_EQ(params.back()->shape, (Shape{(pre_only ? 2 : 6) * kC}));
  }
}

TEST(MMDiTBlock, CheckpointingPoliciesGiveBitwiseEqualGradients) {
  for (bool pre_only : {false, true}) {
    std::vector<float> ref[4];
    for (auto mode : {ActivationCheckpointing::None, ActivationCheckpointing::Selective,
                      ActivationCheckpointing::Full}) {
      Rig rig(mode, pre_only, true, 23);
      rig.grad();
      const std::vector<float> got[4] = {host(*rig.be, rig.dres_x), host(*rig.be, rig.dres_c),
                                         host(*rig.be, rig.dcond), host(*rig.be, rig.bound.grads)};
      if (mode == ActivationCheckpointing::None) {
        for (int i = 0; i < 4; ++i) ref[i] = got[i];
        continue;
      }
      for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], ref[i]) << "mode " << int(mode) << " gradient " << i;
      EXPECT_EQ(rig.saved.rerun_block(), mode == ActivationCheckpointing::Full);
    }
  }
}

TEST(MMDiTBlock, PaddingCutOffByDocumentsChangesNoOtherToken) {
  Rig rig(ActivationCheckpointing::None, false, true, 31);
  rig.grad();
  const auto out_x = host(*rig.be, rig.out_x), out_c = host(*rig.be, rig.out_c);
  const auto dx = host(*rig.be, rig.dres_x), dw = host(*rig.be, rig.bound.grads);
  // New values in sequence 1's padding rows.
  auto c = host(*rig.be, rig.c);
  for (int64_t t = kReal[1]; t < kTc; ++t)
    for (int64_t j = 0; j < kC; ++j) c[static_cast<size_t>(((kTc + t) * kC) + j)] += 3.f;
  upload_f32(*rig.be, rig.c, c.data());
  rig.grad();
  EXPECT_EQ(host(*rig.be, rig.out_x), out_x);
  const auto out_c2 = host(*rig.be, rig.out_c);
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < kReal[b]; ++t)
      for (int64_t j = 0; j < kC; ++j) {
        const size_t i = static_cast<size_t>((b * kTc + t) * kC + j);
        EXPECT_EQ(out_c2[i], out_c[i]) << "sequence " << b << " token " << t;
      }
  EXPECT_EQ(host(*rig.be, rig.dres_x), dx);
  // The parameters' gradients do change (the padding's own rows still pass through its
  // stream's layers), so they are not compared.
  EXPECT_NE(host(*rig.be, rig.bound.grads), dw);
}

}  // namespace
}  // namespace kiln::nn

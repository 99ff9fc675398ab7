#include "nn/adaln_block.h"

#include <algorithm>

namespace kiln::nn {

namespace {

NormSpec plain_layer_norm(float eps) {
  return NormSpec{NormKind::LayerNorm, eps, /*weight=*/false, /*bias=*/false};
}

}  // namespace

AdaLNBlock::AdaLNBlock(const std::string& prefix, const AdaLNBlockSpec& spec)
    : spec_(spec),
      norm_1_(prefix + "norm1", spec.n_embd, plain_layer_norm(spec.norm_eps)),
      norm_2_(prefix + "norm2", spec.n_embd, plain_layer_norm(spec.norm_eps)),
      attn_(prefix + "attn.qkv", prefix + "attn.proj", spec.n_embd, spec.attention,
            /*bias=*/true, spec.init_std, spec.init_std),
      mlp_(spec.mlp, prefix + "mlp.fc1", prefix + "mlp.fc2", spec.n_embd, spec.mlp_hidden,
           /*bias=*/true, spec.init_std, spec.init_std),
      adaln_(prefix + "adaLN_modulation.1", spec.n_embd, 6 * spec.n_embd, /*bias=*/true, 0.f) {
  KILN_CHECK(spec.n_embd > 0 && spec.mlp_hidden > 0,
             "adaLN block {}: n_embd {} and mlp_hidden {} must be > 0", prefix, spec.n_embd,
             spec.mlp_hidden);
  KILN_CHECK(spec.attention.q_width() == spec.n_embd,
             "adaLN block {}: attention width {} x {} must equal n_embd {}", prefix,
             spec.attention.n_head, spec.attention.head_dim, spec.n_embd);
  KILN_CHECK(!spec.attention.qk_norm, "adaLN block {}: no QK-norm (its scratch has none)", prefix);
  adaln_.weight.init = Init::zeros();  // adaLN-Zero: every gate starts closed
  kNorm1 = kMod + 1;
  kMod1 = kNorm1 + norm_1_.num_saved();
  kAttn = kMod1 + 1;
  kAttnOut = kAttn + attn_.num_saved();
  kResidual = kAttnOut + 1;
  kNorm2 = kResidual + 1;
  kMod2 = kNorm2 + norm_2_.num_saved();
  kMlp = kMod2 + 1;
  kMlpOut = kMlp + Mlp::kNumSaved;
  kNumSaved = kMlpOut + 1;
}

std::vector<SavedSpec> AdaLNBlock::saved_specs(int64_t B, int64_t T, DType dtype) const {
  const int64_t C = spec_.n_embd;
  auto stream = [&](std::string name) {
    return SavedSpec{std::move(name), Shape{B, T, C}, dtype, Recompute::WithBlock};
  };
  std::vector<SavedSpec> out;
  out.push_back({adaln_.weight.name + ":out", Shape{B, 6, C}, dtype, Recompute::WithBlock});
  for (auto& sp : norm_1_.saved_specs(B, T, dtype)) out.push_back(sp);
  out.push_back(stream(attn_.qkv.weight.name + ":in"));
  for (auto& sp : attn_.saved_specs(B, T, dtype)) out.push_back(sp);
  out.push_back(stream(attn_.proj.weight.name + ":out"));
  out.push_back(stream(norm_2_.name() + ":in"));
  for (auto& sp : norm_2_.saved_specs(B, T, dtype)) out.push_back(sp);
  out.push_back(stream(mlp_.fc.weight.name + ":in"));
  for (auto& sp : mlp_.saved_specs(B, T, dtype)) out.push_back(sp);
  out.push_back(stream(mlp_.proj.weight.name + ":out"));
  KILN_CHECK(out.size() == kNumSaved, "adaLN block: {} saved tensors, expected {}", out.size(),
             kNumSaved);
  return out;
}

AdaLNScratch AdaLNBlock::make_scratch(Backend& be, int64_t B, int64_t T, DType dtype) const {
  const int64_t C = spec_.n_embd;
  const int64_t big = std::max(mlp_.fc_width(), attn_.local_spec().qkv_width());
  auto act = [&](Shape s) { return be.empty(s, dtype, MemCategory::Activations); };
  return {act({B, T, C}), act({B, T, C}),   act({B, T, C}), act({B, T, attn_.local_spec().q_width()}),
          act({B, T, big}), act({B, 6, C}), act({B, C})};
}

void AdaLNBlock::forward(const AdaLNPass& p, const Tensor& x, const Tensor& out) const {
  Backend& be = p.be;
  const auto& sv = p.saved;
  const auto n1 = sv.subspan(kNorm1, norm_1_.num_saved());
  const auto at = sv.subspan(kAttn, attn_.num_saved());
  const auto n2 = sv.subspan(kNorm2, norm_2_.num_saved());
  const auto ml = sv.subspan(kMlp, Mlp::kNumSaved);
  const Tensor& mod = sv[kMod];
  const Tensor tmp = p.scratch.tmp.view_at(0, x.shape());
  const int64_t B = x.size(0), C = spec_.n_embd;
  adaln_.forward(be, p.s, mod.reshape(Shape{B, 6 * C}), p.cond_silu);
  norm_1_.forward(be, p.s, n1, x);
  be.modulate(p.s, sv[kMod1], n1[Norm::kOut], mod, kScaleMsa, kShiftMsa, 1.f);
  attn_.forward(be, p.s, at, sv[kAttnOut], sv[kMod1], Tensor(), Tensor(), DropoutSpec{});
  be.modulate(p.s, tmp, sv[kAttnOut], mod, kGateMsa, -1, 0.f);
  be.add(p.s, sv[kResidual], x, tmp);
  norm_2_.forward(be, p.s, n2, sv[kResidual]);
  be.modulate(p.s, sv[kMod2], n2[Norm::kOut], mod, kScaleMlp, kShiftMlp, 1.f);
  mlp_.forward(be, p.s, ml, sv[kMlpOut], sv[kMod2]);
  be.modulate(p.s, tmp, sv[kMlpOut], mod, kGateMlp, -1, 0.f);
  be.add(p.s, out, sv[kResidual], tmp);
}

void AdaLNBlock::backward(const AdaLNPass& p, const Tensor& dres, const Tensor& x,
                          const Tensor& out) const {
  Backend& be = p.be;
  const auto& sv = p.saved;
  const auto n1 = sv.subspan(kNorm1, norm_1_.num_saved());
  const auto at = sv.subspan(kAttn, attn_.num_saved());
  const auto n2 = sv.subspan(kNorm2, norm_2_.num_saved());
  const auto ml = sv.subspan(kMlp, Mlp::kNumSaved);
  const Tensor& mod = sv[kMod];
  const AdaLNScratch& w = p.scratch;
  // Recompute what forward did not keep (the same kernels on the same inputs, bitwise).
  if (p.rerun) {
    forward(p, x, out);
  } else if (p.recompute_cheap) {
    mlp_.recompute(be, p.s, ml);
  }
  const int64_t B = x.size(0), T = x.size(1), C = spec_.n_embd;
  const Tensor d1 = w.dtmp.view_at(0, x.shape()), d2 = w.dtmp2.view_at(0, x.shape());
  // Every chunk of dmod is overwritten below: 5, then 4 and 3, 2, 1 and 0.
  // out = r + gate_mlp * f,  f = mlp(modulate(norm_2(r)))
  be.modulate_backward(p.s, d1, w.dmod, dres, sv[kMlpOut], mod, kGateMlp, -1, 0.f);
  mlp_.backward(be, p.s, ml, d2, d1, sv[kMod2], w.dbig.view_at(0, Shape{B, T, mlp_.fc_width()}),
                Tensor());
  be.modulate_backward(p.s, d2, w.dmod, d2, n2[Norm::kOut], mod, kScaleMlp, kShiftMlp, 1.f);
  norm_2_.backward(be, p.s, n2, dres, d2, sv[kResidual]);
  // r = x + gate_msa * a,  a = attn(modulate(norm_1(x)))
  be.modulate_backward(p.s, d1, w.dmod, dres, sv[kAttnOut], mod, kGateMsa, -1, 0.f);
  attn_.backward(be, p.s, at, d2, d1, sv[kMod1], w.dattn,
                 w.dbig.view_at(0, Shape{B, T, attn_.local_spec().qkv_width()}), Tensor(),
                 Tensor(), DropoutSpec{});
  be.modulate_backward(p.s, d2, w.dmod, d2, n1[Norm::kOut], mod, kScaleMsa, kShiftMsa, 1.f);
  norm_1_.backward(be, p.s, n1, dres, d2, x);
  // mod = adaLN_modulation(silu(c))
  adaln_.backward(be, p.s, w.dcond, w.dmod.reshape(Shape{B, 6 * C}), p.cond_silu);
  be.add(p.s, p.dcond_silu, p.dcond_silu, w.dcond);
}

void AdaLNBlock::collect(std::vector<Param*>& out) {
  attn_.collect(out);
  mlp_.collect(out);
  adaln_.collect(out);
}

double AdaLNBlock::matmul_weights() const {
  const double C = static_cast<double>(spec_.n_embd);
  return 4.0 * C * C + 2.0 * C * static_cast<double>(spec_.mlp_hidden);
}

}  // namespace kiln::nn

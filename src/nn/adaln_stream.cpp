#include "nn/adaln_stream.h"

namespace kiln::nn {

namespace {

NormSpec plain_layer_norm(float eps) {
  return NormSpec{NormKind::LayerNorm, eps, /*weight=*/false, /*bias=*/false};
}

std::optional<Mlp> make_mlp(const std::string& prefix, const AdaLNStreamSpec& spec) {
  if (spec.pre_only) return std::nullopt;
  return Mlp(MlpKind::GeluTanh, prefix + "mlp.fc1", prefix + "mlp.fc2", spec.n_embd,
             spec.mlp_hidden, /*bias=*/true, spec.init_std, spec.init_std);
}

}  // namespace

AdaLNStream::AdaLNStream(const std::string& prefix, const AdaLNStreamSpec& spec)
    : spec_(spec),
      norm_1_(prefix + "norm1", spec.n_embd, plain_layer_norm(spec.norm_eps)),
      norm_2_(prefix + "norm2", spec.n_embd, plain_layer_norm(spec.norm_eps)),
      mlp_(make_mlp(prefix, spec)),
      adaln_(prefix + "adaLN_modulation.1", spec.n_embd, (spec.pre_only ? 2 : 6) * spec.n_embd,
             /*bias=*/true, 0.f) {
  KILN_CHECK(spec.n_embd > 0 && (spec.pre_only || spec.mlp_hidden > 0),
             "adaLN block {}: n_embd {} and mlp_hidden {} must be > 0", prefix, spec.n_embd,
             spec.mlp_hidden);
  adaln_.weight.init = Init::zeros();  // adaLN-Zero: every gate starts closed
  kNorm1 = kMod + 1;
  kAttnIn = kNorm1 + norm_1_.num_saved();
  kNumPre = kAttnIn + 1;
  if (spec.pre_only) return;
  kResidual = kAttnOut + 1;
  kNorm2 = kResidual + 1;
  kMlpIn = kNorm2 + norm_2_.num_saved();
  kMlp = kMlpIn + 1;
  kMlpOut = kMlp + Mlp::kNumSaved;
  kNumPost = kMlpOut + 1;
}

std::vector<SavedSpec> AdaLNStream::pre_saved_specs(int64_t B, int64_t T, DType dtype) const {
  std::vector<SavedSpec> out;
  out.push_back({adaln_.weight.name + ":out", Shape{B, chunks(), spec_.n_embd}, dtype,
                 Recompute::WithBlock});
  for (auto& sp : norm_1_.saved_specs(B, T, dtype)) out.push_back(sp);
  out.push_back({norm_1_.name() + ":modulated", Shape{B, T, spec_.n_embd}, dtype,
                 Recompute::WithBlock});
  KILN_CHECK(out.size() == kNumPre, "adaLN stream: {} saved tensors, expected {}", out.size(),
             kNumPre);
  return out;
}

std::vector<SavedSpec> AdaLNStream::post_saved_specs(int64_t B, int64_t T, DType dtype) const {
  std::vector<SavedSpec> out;
  if (!mlp_) return out;
  auto stream = [&](std::string name) {
    return SavedSpec{std::move(name), Shape{B, T, spec_.n_embd}, dtype, Recompute::WithBlock};
  };
  out.push_back(stream(norm_1_.name() + ":attention"));
  out.push_back(stream(norm_2_.name() + ":in"));
  for (auto& sp : norm_2_.saved_specs(B, T, dtype)) out.push_back(sp);
  out.push_back(stream(mlp_->fc.weight.name + ":in"));
  for (auto& sp : mlp_->saved_specs(B, T, dtype)) out.push_back(sp);
  out.push_back(stream(mlp_->proj.weight.name + ":out"));
  KILN_CHECK(out.size() == kNumPost, "adaLN stream: {} saved tensors, expected {}", out.size(),
             kNumPost);
  return out;
}

void AdaLNStream::pre_forward(const AdaLNStreamPass& p, std::span<const Tensor> pre,
                              const Tensor& x) const {
  const auto n1 = pre.subspan(kNorm1, norm_1_.num_saved());
  const Tensor& mod = pre[kMod];
  const int64_t B = x.size(0), C = spec_.n_embd;
  adaln_.forward(p.be, p.s, mod.reshape(Shape{B, chunks() * C}), p.cond_silu);
  norm_1_.forward(p.be, p.s, n1, x);
  p.be.modulate(p.s, pre[kAttnIn], n1[Norm::kOut], mod, kScaleMsa, kShiftMsa, 1.f);
}

void AdaLNStream::post_forward(const AdaLNStreamPass& p, std::span<const Tensor> pre,
                               std::span<const Tensor> post, const Tensor& x, const Tensor& out,
                               const Tensor& tmp) const {
  KILN_CHECK(mlp_, "adaLN stream {}: a pre-only stream has no post part", adaln_.name());
  Backend& be = p.be;
  const auto n2 = post.subspan(kNorm2, norm_2_.num_saved());
  const auto ml = post.subspan(kMlp, Mlp::kNumSaved);
  const Tensor& mod = pre[kMod];
  be.modulate(p.s, tmp, post[kAttnOut], mod, kGateMsa, -1, 0.f);
  be.add(p.s, post[kResidual], x, tmp);
  norm_2_.forward(be, p.s, n2, post[kResidual]);
  be.modulate(p.s, post[kMlpIn], n2[Norm::kOut], mod, kScaleMlp, kShiftMlp, 1.f);
  mlp_->forward(be, p.s, ml, post[kMlpOut], post[kMlpIn]);
  be.modulate(p.s, tmp, post[kMlpOut], mod, kGateMlp, -1, 0.f);
  be.add(p.s, out, post[kResidual], tmp);
}

void AdaLNStream::recompute_cheap(const AdaLNStreamPass& p, std::span<const Tensor> post) const {
  if (mlp_) mlp_->recompute(p.be, p.s, post.subspan(kMlp, Mlp::kNumSaved));
}

void AdaLNStream::post_backward(const AdaLNStreamPass& p, std::span<const Tensor> pre,
                                std::span<const Tensor> post, const Tensor& dres,
                                const Tensor& dattn_out, const Tensor& d1, const Tensor& d2,
                                const Tensor& dfc, const Tensor& dmod) const {
  KILN_CHECK(mlp_, "adaLN stream {}: a pre-only stream has no post part", adaln_.name());
  Backend& be = p.be;
  const auto n2 = post.subspan(kNorm2, norm_2_.num_saved());
  const auto ml = post.subspan(kMlp, Mlp::kNumSaved);
  const Tensor& mod = pre[kMod];
  // out = r + gate_mlp * f,  f = mlp(modulate(norm_2(r)))
  be.modulate_backward(p.s, d1, dmod, dres, post[kMlpOut], mod, kGateMlp, -1, 0.f);
  mlp_->backward(be, p.s, ml, d2, d1, post[kMlpIn], dfc, Tensor());
  be.modulate_backward(p.s, d2, dmod, d2, n2[Norm::kOut], mod, kScaleMlp, kShiftMlp, 1.f);
  norm_2_.backward(be, p.s, n2, dres, d2, post[kResidual]);
  // r = x + gate_msa * a
  be.modulate_backward(p.s, dattn_out, dmod, dres, post[kAttnOut], mod, kGateMsa, -1, 0.f);
}

void AdaLNStream::pre_backward(const AdaLNStreamPass& p, std::span<const Tensor> pre,
                               const Tensor& dres, const Tensor& dattn_in, const Tensor& x,
                               const Tensor& dmod, const Tensor& dcond) const {
  Backend& be = p.be;
  const auto n1 = pre.subspan(kNorm1, norm_1_.num_saved());
  const Tensor& mod = pre[kMod];
  const int64_t B = x.size(0), C = spec_.n_embd;
  const Tensor dm = dmod.view_at(0, Shape{B, chunks(), C});
  // a_in = modulate(norm_1(x), shift_msa, scale_msa)
  be.modulate_backward(p.s, dattn_in, dm, dattn_in, n1[Norm::kOut], mod, kScaleMsa, kShiftMsa,
                       1.f);
  norm_1_.backward(be, p.s, n1, dres, dattn_in, x);
  // mod = adaLN_modulation(silu(c))
  adaln_.backward(be, p.s, dcond, dm.reshape(Shape{B, chunks() * C}), p.cond_silu);
  be.add(p.s, p.dcond_silu, p.dcond_silu, dcond);
}

void AdaLNStream::collect(std::vector<Param*>& out) {
  if (mlp_) mlp_->collect(out);
  adaln_.collect(out);
}

double AdaLNStream::matmul_weights() const {
  return mlp_ ? 2.0 * static_cast<double>(spec_.n_embd) * static_cast<double>(spec_.mlp_hidden)
              : 0.0;
}

}  // namespace kiln::nn

#include "nn/mmdit_block.h"

#include <algorithm>

namespace kiln::nn {

namespace {

AdaLNStreamSpec stream_spec(const MMDiTBlockSpec& spec, bool pre_only) {
  AdaLNStreamSpec s;
  s.n_embd = spec.n_embd;
  s.norm_eps = spec.norm_eps;
  s.mlp_hidden = spec.mlp_hidden;
  s.init_std = spec.init_std;
  s.pre_only = pre_only;
  return s;
}

}  // namespace

MMDiTBlock::MMDiTBlock(const std::string& prefix, const MMDiTBlockSpec& spec)
    : spec_(spec),
      x_(prefix + "x_block.", stream_spec(spec, false)),
      c_(prefix + "context_block.", stream_spec(spec, spec.context_pre_only)),
      attn_(prefix + "x_block.attn", prefix + "context_block.attn", spec.n_embd, spec.attention,
            spec.init_std, spec.context_pre_only) {
  kCPre = x_.num_pre_saved();
  kAttn = kCPre + c_.num_pre_saved();
  kXPost = kAttn + JointAttention::kNumSaved;
  kCPost = kXPost + x_.num_post_saved();
  kNumSaved = kCPost + c_.num_post_saved();
}

std::vector<SavedSpec> MMDiTBlock::saved_specs(int64_t B, int64_t Tx, int64_t Tc,
                                               DType dtype) const {
  std::vector<SavedSpec> out = x_.pre_saved_specs(B, Tx, dtype);
  auto append = [&](std::vector<SavedSpec> more) {
    for (auto& sp : more) out.push_back(std::move(sp));
  };
  append(c_.pre_saved_specs(B, Tc, dtype));
  append(attn_.saved_specs(B, Tx, Tc, dtype));
  append(x_.post_saved_specs(B, Tx, dtype));
  append(c_.post_saved_specs(B, Tc, dtype));
  KILN_CHECK(out.size() == kNumSaved, "MMDiT block: {} saved tensors, expected {}", out.size(),
             kNumSaved);
  return out;
}

MMDiTScratch MMDiTBlock::make_scratch(Backend& be, int64_t B, int64_t Tx, int64_t Tc,
                                      DType dtype) const {
  const int64_t C = spec_.n_embd, T = Tx + Tc;
  auto act = [&](Shape s) { return be.empty(s, dtype, MemCategory::Activations); };
  MMDiTScratch w;
  w.common = {act({B, T, C}), act({B, T, C}), act({B, T, C}), Tensor(),
              act({B, T, std::max<int64_t>(spec_.mlp_hidden, 1)}), act({B, 6, C}), act({B, C})};
  w.dmod_c = act({B, 6, C});
  w.attn = attn_.make_scratch(be, B, Tx, Tc, dtype);
  return w;
}

MMDiTBlock::Runs MMDiTBlock::runs(std::span<const Tensor> saved) const {
  return {saved.subspan(0, kCPre), saved.subspan(kCPre, kAttn - kCPre),
          saved.subspan(kAttn, JointAttention::kNumSaved), saved.subspan(kXPost, kCPost - kXPost),
          saved.subspan(kCPost, kNumSaved - kCPost)};
}

void MMDiTBlock::forward(const MMDiTPass& p, const Tensor& x, const Tensor& c,
                         const Tensor& out_x, const Tensor& out_c) const {
  const auto [xpre, cpre, at, xpost, cpost] = runs(p.saved);
  const AdaLNStreamPass sp = stream_pass(p);
  x_.pre_forward(sp, xpre, x);
  c_.pre_forward(sp, cpre, c);
  attn_.forward(p.be, p.s, at, x_.attention_output(xpost),
                attn_.context_pre_only() ? Tensor() : c_.attention_output(cpost),
                x_.attention_input(xpre), c_.attention_input(cpre), p.cu_seqlens, p.scratch.attn);
  x_.post_forward(sp, xpre, xpost, x, out_x, p.scratch.common.tmp.view_at(0, x.shape()));
  if (!attn_.context_pre_only())
    c_.post_forward(sp, cpre, cpost, c, out_c, p.scratch.common.tmp.view_at(0, c.shape()));
}

void MMDiTBlock::backward(const MMDiTPass& p, const Tensor& dres_x, const Tensor& dres_c,
                          const Tensor& x, const Tensor& c, const Tensor& out_x,
                          const Tensor& out_c) const {
  const auto [xpre, cpre, at, xpost, cpost] = runs(p.saved);
  const AdaLNStreamPass sp = stream_pass(p);
  const AdaLNScratch& w = p.scratch.common;
  // Recompute what forward did not keep (the same kernels on the same inputs, bitwise).
  if (p.rerun) {
    forward(p, x, c, out_x, out_c);
  } else if (p.recompute_cheap) {
    x_.recompute_cheap(sp, xpost);
    c_.recompute_cheap(sp, cpost);
  }
  const int64_t B = x.size(0), Tx = x.size(1), Tc = c.size(1), C = spec_.n_embd;
  const int64_t H = x_.mlp_width();
  // tmp holds both streams' attention-output gradients, dtmp their attention-input ones;
  // dtmp2 (and dtmp, until then) are the post parts' scratch.
  const Tensor dox = w.tmp.view_at(0, x.shape()), doc = w.tmp.view_at(B * Tx * C, c.shape());
  const Tensor dix = w.dtmp.view_at(0, x.shape()), dic = w.dtmp.view_at(B * Tx * C, c.shape());
  const Tensor d1 = w.dtmp, d2 = w.dtmp2;
  x_.post_backward(sp, xpre, xpost, dres_x, dox, d1.view_at(0, x.shape()),
                   d2.view_at(0, x.shape()), w.dbig.view_at(0, Shape{B, Tx, H}), w.dmod);
  if (!attn_.context_pre_only())
    c_.post_backward(sp, cpre, cpost, dres_c, doc, d1.view_at(0, c.shape()),
                     d2.view_at(0, c.shape()), w.dbig.view_at(0, Shape{B, Tc, H}), p.scratch.dmod_c);
  attn_.backward(p.be, p.s, at, dix, dic, dox, doc, x_.attention_input(xpre),
                 c_.attention_input(cpre), p.cu_seqlens, p.scratch.attn);
  x_.pre_backward(sp, xpre, dres_x, dix, x, w.dmod, w.dcond);
  c_.pre_backward(sp, cpre, dres_c, dic, c, p.scratch.dmod_c, w.dcond);
}

void MMDiTBlock::collect(std::vector<Param*>& out) {
  attn_.collect_x(out);
  x_.collect(out);
  attn_.collect_c(out);
  c_.collect(out);
}

double MMDiTBlock::x_matmul_weights() const {
  return attn_.x_matmul_weights() + x_.matmul_weights();
}

double MMDiTBlock::c_matmul_weights() const {
  return attn_.c_matmul_weights() + c_.matmul_weights();
}

}  // namespace kiln::nn

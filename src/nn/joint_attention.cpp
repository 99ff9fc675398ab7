#include "nn/joint_attention.h"

namespace kiln::nn {

namespace {

std::optional<Linear> make_c_proj(const std::string& c_prefix, int64_t C, float init_std,
                                  bool context_pre_only) {
  if (context_pre_only) return std::nullopt;
  return Linear(c_prefix + ".proj", C, C, /*bias=*/true, init_std);
}

}  // namespace

JointAttention::JointAttention(const std::string& x_prefix, const std::string& c_prefix,
                               int64_t C, const AttentionSpec& spec, float init_std,
                               bool context_pre_only)
    : spec_(spec),
      C_(C),
      x_qkv_(x_prefix + ".qkv", C, spec.qkv_width(), /*bias=*/true, init_std),
      x_proj_(x_prefix + ".proj", C, C, /*bias=*/true, init_std),
      c_qkv_(c_prefix + ".qkv", C, spec.qkv_width(), /*bias=*/true, init_std),
      c_proj_(make_c_proj(c_prefix, C, init_std, context_pre_only)) {
  spec.check();
  KILN_CHECK(!spec.causal && !spec.rotary && !spec.qk_norm,
             "joint attention {}: bidirectional, without rotary or QK-norm (not implemented)",
             x_prefix);
  KILN_CHECK(spec.q_width() == C, "joint attention {}: {} heads x {} must equal the width {}",
             x_prefix, spec.n_head, spec.head_dim, C);
}

std::vector<SavedSpec> JointAttention::saved_specs(int64_t B, int64_t Tx, int64_t Tc,
                                                   DType dtype) const {
  const int64_t T = Tx + Tc;
  return {{x_qkv_.weight.name + ":joint", Shape{B, T, spec_.qkv_width()}, dtype, Recompute::WithBlock},
          {x_proj_.weight.name + ":joint_in", Shape{B, T, C_}, dtype, Recompute::WithBlock},
          {x_qkv_.weight.name + ":lse", Shape{B, spec_.n_head, T}, DType::F32, Recompute::WithBlock}};
}

JointAttentionScratch JointAttention::make_scratch(Backend& be, int64_t B, int64_t Tx, int64_t Tc,
                                                   DType dtype) const {
  const int64_t T = Tx + Tc, W = spec_.qkv_width();
  auto act = [&](Shape s) { return be.empty(s, dtype, MemCategory::Activations); };
  return {act({B, T, W}), act({B, T, C_}), act({B, T, C_}), act({B, T, W})};
}

void JointAttention::join(Backend& be, Stream s, const Tensor& joint, const Tensor& xs,
                          const Tensor& cs) const {
  const int64_t B = joint.size(0), T = joint.size(1), W = joint.size(2), Tx = xs.size(1);
  const Tensor rows = joint.reshape(Shape{B, T * W});
  be.copy_columns(s, rows, xs.reshape(Shape{B, Tx * W}), 0, 0, Tx * W);
  be.copy_columns(s, rows, cs.reshape(Shape{B, (T - Tx) * W}), Tx * W, 0, (T - Tx) * W);
}

void JointAttention::split(Backend& be, Stream s, const Tensor& xs, const Tensor& cs,
                           const Tensor& joint) const {
  const int64_t B = joint.size(0), T = joint.size(1), W = joint.size(2), Tx = xs.size(1);
  const Tensor rows = joint.reshape(Shape{B, T * W});
  be.copy_columns(s, xs.reshape(Shape{B, Tx * W}), rows, 0, 0, Tx * W);
  be.copy_columns(s, cs.reshape(Shape{B, (T - Tx) * W}), rows, 0, Tx * W, (T - Tx) * W);
}

void JointAttention::forward(Backend& be, Stream s, std::span<const Tensor> saved,
                             const Tensor& out_x, const Tensor& out_c, const Tensor& x,
                             const Tensor& c, const Tensor& cu_seqlens,
                             const JointAttentionScratch& w) const {
  const int64_t B = x.size(0), Tx = x.size(1), Tc = c.size(1), W = spec_.qkv_width();
  const Tensor qx = w.qkv_parts.view_at(0, Shape{B, Tx, W});
  const Tensor qc = w.qkv_parts.view_at(B * Tx * W, Shape{B, Tc, W});
  x_qkv_.forward(be, s, qx, x);
  c_qkv_.forward(be, s, qc, c);
  join(be, s, saved[kQkv], qx, qc);
  if (cu_seqlens) {
    be.attention_varlen_forward(s, saved[kAttn], saved[kLse], saved[kQkv], cu_seqlens, spec_, {});
  } else {
    be.attention_forward(s, saved[kAttn], saved[kLse], saved[kQkv], spec_, {});
  }
  const Tensor ax = w.attn_parts.view_at(0, Shape{B, Tx, C_});
  const Tensor ac = w.attn_parts.view_at(B * Tx * C_, Shape{B, Tc, C_});
  split(be, s, ax, ac, saved[kAttn]);
  x_proj_.forward(be, s, out_x, ax);
  if (c_proj_) c_proj_->forward(be, s, out_c, ac);
}

void JointAttention::backward(Backend& be, Stream s, std::span<const Tensor> saved,
                              const Tensor& dx, const Tensor& dc, const Tensor& dout_x,
                              const Tensor& dout_c, const Tensor& x, const Tensor& c,
                              const Tensor& cu_seqlens, const JointAttentionScratch& w) const {
  const int64_t B = x.size(0), Tx = x.size(1), Tc = c.size(1), W = spec_.qkv_width();
  // The projections' inputs: the streams' rows of a, copied out again.
  const Tensor ax = w.attn_parts.view_at(0, Shape{B, Tx, C_});
  const Tensor ac = w.attn_parts.view_at(B * Tx * C_, Shape{B, Tc, C_});
  split(be, s, ax, ac, saved[kAttn]);
  const Tensor dax = w.dattn.view_at(0, Shape{B, Tx, C_});
  const Tensor dac = w.dattn.view_at(B * Tx * C_, Shape{B, Tc, C_});
  x_proj_.backward(be, s, dax, dout_x, ax);
  if (c_proj_) {
    c_proj_->backward(be, s, dac, dout_c, ac);
  } else {
    be.fill(s, dac, 0.f);  // the context's outputs are not used
  }
  const Tensor da = w.attn_parts.view_at(0, Shape{B, Tx + Tc, C_});
  join(be, s, da, dax, dac);
  if (cu_seqlens) {
    be.attention_varlen_backward(s, w.dqkv, da, saved[kQkv], saved[kAttn], saved[kLse],
                                 cu_seqlens, spec_, {});
  } else {
    be.attention_backward(s, w.dqkv, da, saved[kQkv], saved[kAttn], saved[kLse], spec_, {});
  }
  const Tensor dqx = w.qkv_parts.view_at(0, Shape{B, Tx, W});
  const Tensor dqc = w.qkv_parts.view_at(B * Tx * W, Shape{B, Tc, W});
  split(be, s, dqx, dqc, w.dqkv);
  x_qkv_.backward(be, s, dx, dqx, x);
  c_qkv_.backward(be, s, dc, dqc, c);
}

void JointAttention::collect_x(std::vector<Param*>& out) {
  x_qkv_.collect(out);
  x_proj_.collect(out);
}

void JointAttention::collect_c(std::vector<Param*>& out) {
  c_qkv_.collect(out);
  if (c_proj_) c_proj_->collect(out);
}

double JointAttention::x_matmul_weights() const {
  return static_cast<double>(C_) * static_cast<double>(spec_.qkv_width() + C_);
}

double JointAttention::c_matmul_weights() const {
  return static_cast<double>(C_) * static_cast<double>(spec_.qkv_width() + (c_proj_ ? C_ : 0));
}

}  // namespace kiln::nn

#include "nn/attention.h"

namespace kiln::nn {

void AttentionSpec::check() const {
  KILN_CHECK(n_head > 0 && head_dim > 0 && kv_heads() > 0 && n_head % kv_heads() == 0,
             "attention: {} query heads over {} key/value heads of size {}: need NH > 0, HD > 0 "
             "and NH a multiple of NKV", n_head, kv_heads(), head_dim);
  KILN_CHECK(!rotary || head_dim % 2 == 0, "attention: rotary needs an even head size, not {}",
             head_dim);
  KILN_CHECK(!qk_norm || qk_norm_eps > 0.f, "attention: QK-norm needs epsilon > 0, not {}",
             qk_norm_eps);
}

namespace {

// A QK-norm gain [HD] named `name` (RMSNorm over a head), or no parameter without
// spec.qk_norm. Checks the spec first, so that a bad shape is its error, not the norm's.
Norm qk_gain(const std::string& name, const AttentionSpec& spec) {
  spec.check();
  KILN_CHECK(!spec.qk_norm || !name.empty(), "attention: QK-norm needs the gains' names");
  return Norm(name, spec.head_dim,
              NormSpec{NormKind::RMSNorm, spec.qk_norm_eps, /*weight=*/spec.qk_norm,
                       /*bias=*/false});
}

}  // namespace

SelfAttention::SelfAttention(const std::string& qkv_name, const std::string& out_name, int64_t C,
                             const AttentionSpec& spec, bool bias, float init_std,
                             float out_init_std, const std::string& q_norm_name,
                             const std::string& k_norm_name)
    : qkv(qkv_name, C, spec.qkv_width(), bias, init_std,
          {{"q", spec.q_width()}, {"k", spec.kv_width()}, {"v", spec.kv_width()}}),
      proj(out_name, spec.q_width(), C, bias, out_init_std),
      q_norm(qk_gain(q_norm_name, spec)),
      k_norm(qk_gain(k_norm_name, spec)),
      spec_(spec),
      local_(spec) {}

void SelfAttention::shard(const AttentionPlacement& placement) {
  if (!column_row_split(placement.qkv, placement.proj, qkv.weight.name)) return;
  TpGroup& group = *placement.qkv.group;
  const int tp = group.size();
  KILN_CHECK(spec_.n_head % tp == 0 && spec_.kv_heads() % tp == 0,
             "{}: {} query heads and {} key/value heads do not divide over tp = {}",
             qkv.weight.name, spec_.n_head, spec_.kv_heads(), tp);
  // q, k and v split separately, so that a rank holds its heads of each.
  qkv.shard(placement.qkv);
  proj.shard(placement.proj);
  local_.n_head = spec_.n_head / tp;
  local_.n_kv_head = spec_.kv_heads() / tp;
  first_head_ = group.rank() * local_.n_head;
  // A rank normalises its own heads: the gains' gradients sum over the group's heads.
  q_norm.weight.tp_partial_grad = k_norm.weight.tp_partial_grad = spec_.qk_norm;
}

DropoutSpec SelfAttention::at_heads(const DropoutSpec& d) const {
  DropoutSpec g = d;
  if (local_.n_head != spec_.n_head) g.head_offset = first_head_, g.total_heads = spec_.n_head;
  return g;
}

std::vector<SavedSpec> SelfAttention::saved_specs(int64_t B, int64_t T, DType dtype) const {
  std::vector<SavedSpec> out{
      {qkv.weight.name + ":out", Shape{B, T, local_.qkv_width()}, dtype, Recompute::WithBlock},
      {proj.weight.name + ":in", Shape{B, T, local_.q_width()}, dtype, Recompute::WithBlock},
      {proj.weight.name + ":lse", Shape{B, local_.n_head, T}, DType::F32, Recompute::WithBlock}};
  if (!spec_.qk_norm) return out;
  out.push_back({q_norm.name() + ":in", Shape{B, T, local_.q_width()}, dtype, Recompute::WithBlock});
  out.push_back({k_norm.name() + ":in", Shape{B, T, local_.kv_width()}, dtype, Recompute::WithBlock});
  out.push_back({q_norm.name() + ":rstd", Shape{B * T * local_.n_head}, DType::F32,
                 Recompute::WithBlock});
  out.push_back({k_norm.name() + ":rstd", Shape{B * T * local_.kv_heads()}, DType::F32,
                 Recompute::WithBlock});
  return out;
}

void SelfAttention::norm_qk(Backend& be, Stream s, const Tensor& qkv_buf,
                            std::span<const Tensor> norm_saved, const Tensor& tmp,
                            const AttentionShape& shape) const {
  const int64_t HD = shape.head_dim;
  for (const bool k : {false, true}) {
    const Norm& norm = k ? k_norm : q_norm;
    const Tensor& in = norm_saved[k ? 1 : 0];  // [B,T,width]: the projection's heads
    const Tensor& rstd = norm_saved[k ? 3 : 2];
    const int64_t col = k ? shape.q_width() : 0, width = k ? shape.kv_width() : shape.q_width();
    const int64_t N = in.numel() / width;  // B*T
    be.copy_columns(s, in, qkv_buf, 0, col, width);
    const Tensor out = tmp.view_at(0, Shape{N * width / HD, HD});
    norm.forward_into(be, s, out, Tensor(), rstd, in.reshape(out.shape()));
    be.copy_columns(s, qkv_buf, out.reshape(Shape{N, width}), col, 0, width);
  }
}

void SelfAttention::norm_qk_backward(Backend& be, Stream s, const Tensor& dqkv,
                                     std::span<const Tensor> norm_saved,
                                     const Tensor& scratch) const {
  const int64_t HD = local_.head_dim;
  for (const bool k : {false, true}) {
    const Norm& norm = k ? k_norm : q_norm;
    const Tensor& in = norm_saved[k ? 1 : 0];
    const Tensor& rstd = norm_saved[k ? 3 : 2];
    const int64_t col = k ? local_.q_width() : 0, width = k ? local_.kv_width() : local_.q_width();
    const int64_t N = in.numel() / width, rows = N * width / HD;
    const Tensor dout = scratch.view_at(0, Shape{N, width});
    const Tensor dinp = scratch.view_at(N * width, Shape{N, width});
    be.copy_columns(s, dout, dqkv, 0, col, width);
    be.fill(s, dinp, 0.f);  // rmsnorm_backward adds
    norm.backward_from(be, s, dinp.reshape(Shape{rows, HD}), dout.reshape(Shape{rows, HD}),
                       in.reshape(Shape{rows, HD}), Tensor(), rstd);
    be.copy_columns(s, dqkv, dinp, col, 0, width);
  }
}

void SelfAttention::forward(Backend& be, Stream s, std::span<const Tensor> saved,
                            const Tensor& out, const Tensor& inp, const Tensor& positions,
                            const Tensor& cu_seqlens, const DropoutSpec& dropout,
                            const Tensor& work) const {
  qkv.forward(be, s, saved[kQkv], inp, work);
  // saved[kAttn] is free until attention writes it: QK-norm's output goes there first.
  if (spec_.qk_norm) norm_qk(be, s, saved[kQkv], saved.subspan(kQIn, 4), saved[kAttn], local_);
  if (spec_.rotary) be.rope_forward(s, saved[kQkv], positions, local_, spec_.rope);
  if (cp_) {
    KILN_CHECK(!dropout.enabled(), "{}: attention dropout with context parallelism is not "
               "supported (set model.dropout = 0 or parallel.cp = 1)", qkv.weight.name);
    ring_attention_forward(be, s, *cp_, saved[kAttn], saved[kLse], saved[kQkv], cu_seqlens,
                           local_);
  } else if (cu_seqlens) {
    be.attention_varlen_forward(s, saved[kAttn], saved[kLse], saved[kQkv], cu_seqlens, local_,
                                at_heads(dropout));
  } else {
    be.attention_forward(s, saved[kAttn], saved[kLse], saved[kQkv], local_, at_heads(dropout));
  }
  proj.forward(be, s, out, saved[kAttn], work);
}

void SelfAttention::backward(Backend& be, Stream s, std::span<const Tensor> saved,
                             const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                             const Tensor& dattn, const Tensor& dqkv, const Tensor& positions,
                             const Tensor& cu_seqlens, const DropoutSpec& dropout,
                             const Tensor& work) const {
  const Tensor dat = dattn.view_at(0, saved[kAttn].shape());
  proj.backward(be, s, dat, dout, saved[kAttn], work);
  if (cp_) {
    ring_attention_backward(be, s, *cp_, dqkv, dat, saved[kQkv], saved[kAttn], saved[kLse],
                            cu_seqlens, local_);
  } else if (cu_seqlens) {
    be.attention_varlen_backward(s, dqkv, dat, saved[kQkv], saved[kAttn], saved[kLse], cu_seqlens,
                                 local_, at_heads(dropout));
  } else {
    be.attention_backward(s, dqkv, dat, saved[kQkv], saved[kAttn], saved[kLse], local_,
                          at_heads(dropout));
  }
  if (spec_.rotary) be.rope_backward(s, dqkv, positions, local_, spec_.rope);
  if (spec_.qk_norm) norm_qk_backward(be, s, dqkv, saved.subspan(kQIn, 4), dattn);
  qkv.backward(be, s, dinp, dqkv, inp, work);
}

void SelfAttention::decode(Backend& be, Stream s, const Tensor& out, const Tensor& inp,
                           const Tensor& qkv_buf, const Tensor& attn, const Tensor& k_cache,
                           const Tensor& v_cache, int64_t past, const Tensor& positions) const {
  qkv.forward(be, s, qkv_buf, inp);
  if (spec_.qk_norm) {
    const int64_t rows = qkv_buf.numel() / spec_.qkv_width();  // B*Tq
    auto tmp = [&](Shape shape, DType dtype) {
      return be.empty(shape, dtype, MemCategory::Temporaries);
    };
    const Tensor norm_bufs[4] = {tmp(Shape{rows, spec_.q_width()}, qkv_buf.dtype()),
                                 tmp(Shape{rows, spec_.kv_width()}, qkv_buf.dtype()),
                                 tmp(Shape{rows * spec_.n_head}, DType::F32),
                                 tmp(Shape{rows * spec_.kv_heads()}, DType::F32)};
    norm_qk(be, s, qkv_buf, norm_bufs, attn, spec_);  // attn: free until attention
  }
  if (spec_.rotary) {
    KILN_CHECK(positions || past == 0, "attention decode: rotary needs the positions of tokens "
               "past {}", past);
    be.rope_forward(s, qkv_buf, positions, spec_, spec_.rope);
  }
  KILN_CHECK(!cp_, "{}: decoding with context parallelism is not supported", qkv.weight.name);
  be.attention_decode(s, attn, k_cache, v_cache, qkv_buf, past, spec_);
  proj.forward(be, s, out, attn);
}

void SelfAttention::collect(std::vector<Param*>& out) {
  qkv.collect(out);
  q_norm.collect(out);  // nothing without QK-norm
  k_norm.collect(out);
  proj.collect(out);
}

}  // namespace kiln::nn

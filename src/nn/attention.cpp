#include "nn/attention.h"

namespace kiln::nn {

void AttentionSpec::check() const {
  KILN_CHECK(n_head > 0 && head_dim > 0 && kv_heads() > 0 && n_head % kv_heads() == 0,
             "attention: {} query heads over {} key/value heads of size {}: need NH > 0, HD > 0 "
             "and NH a multiple of NKV", n_head, kv_heads(), head_dim);
  KILN_CHECK(!rotary || head_dim % 2 == 0, "attention: rotary needs an even head size, not {}",
             head_dim);
}

SelfAttention::SelfAttention(const std::string& qkv_name, const std::string& out_name, int64_t C,
                             const AttentionSpec& spec, bool bias, float init_std,
                             float out_init_std)
    : qkv(qkv_name, C, spec.qkv_width(), bias, init_std),
      proj(out_name, spec.q_width(), C, bias, out_init_std), spec_(spec), local_(spec) {
  spec.check();
}

void SelfAttention::shard(const AttentionPlacement& placement) {
  if (!column_row_split(placement.qkv, placement.proj, qkv.weight.name)) return;
  TpGroup& group = *placement.qkv.group;
  const int tp = group.size();
  KILN_CHECK(spec_.n_head % tp == 0 && spec_.kv_heads() % tp == 0,
             "{}: {} query heads and {} key/value heads do not divide over tp = {}",
             qkv.weight.name, spec_.n_head, spec_.kv_heads(), tp);
  // q, k and v split separately, so that a rank holds its heads of each.
  qkv.shard(placement.qkv, {spec_.q_width(), spec_.kv_width(), spec_.kv_width()});
  proj.shard(placement.proj);
  local_.n_head = spec_.n_head / tp;
  local_.n_kv_head = spec_.kv_heads() / tp;
  first_head_ = group.rank() * local_.n_head;
}

DropoutSpec SelfAttention::at_heads(const DropoutSpec& d) const {
  DropoutSpec g = d;
  if (local_.n_head != spec_.n_head) g.head_offset = first_head_, g.total_heads = spec_.n_head;
  return g;
}

std::vector<SavedSpec> SelfAttention::saved_specs(int64_t B, int64_t T, DType dtype) const {
  return {{qkv.weight.name + ":out", Shape{B, T, local_.qkv_width()}, dtype, Recompute::WithBlock},
          {proj.weight.name + ":in", Shape{B, T, local_.q_width()}, dtype, Recompute::WithBlock},
          {proj.weight.name + ":lse", Shape{B, local_.n_head, T}, DType::F32, Recompute::WithBlock}};
}

void SelfAttention::forward(Backend& be, Stream s, std::span<const Tensor> saved,
                            const Tensor& out, const Tensor& inp, const Tensor& positions,
                            const DropoutSpec& dropout, const Tensor& work) const {
  qkv.forward(be, s, saved[kQkv], inp, work);
  if (spec_.rotary) be.rope_forward(s, saved[kQkv], positions, local_, spec_.rope);
  if (cp_) {
    KILN_CHECK(!dropout.enabled(), "{}: attention dropout with context parallelism is not "
               "supported (set model.dropout = 0 or parallel.cp = 1)", qkv.weight.name);
    ring_attention_forward(be, s, *cp_, saved[kAttn], saved[kLse], saved[kQkv], local_);
  } else {
    be.attention_forward(s, saved[kAttn], saved[kLse], saved[kQkv], local_, at_heads(dropout));
  }
  proj.forward(be, s, out, saved[kAttn], work);
}

void SelfAttention::backward(Backend& be, Stream s, std::span<const Tensor> saved,
                             const Tensor& dinp, const Tensor& dout, const Tensor& inp,
                             const Tensor& dattn, const Tensor& dqkv, const Tensor& positions,
                             const DropoutSpec& dropout, const Tensor& work) const {
  proj.backward(be, s, dattn, dout, saved[kAttn], work);
  if (cp_) {
    ring_attention_backward(be, s, *cp_, dqkv, dattn, saved[kQkv], saved[kAttn], saved[kLse],
                            local_);
  } else {
    be.attention_backward(s, dqkv, dattn, saved[kQkv], saved[kAttn], saved[kLse], local_,
                          at_heads(dropout));
  }
  if (spec_.rotary) be.rope_backward(s, dqkv, positions, local_, spec_.rope);
  qkv.backward(be, s, dinp, dqkv, inp, work);
}

void SelfAttention::decode(Backend& be, Stream s, const Tensor& out, const Tensor& inp,
                           const Tensor& qkv_buf, const Tensor& attn, const Tensor& k_cache,
                           const Tensor& v_cache, int64_t past, const Tensor& positions) const {
  qkv.forward(be, s, qkv_buf, inp);
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
  proj.collect(out);
}

}  // namespace kiln::nn

#include "nn/block.h"

#include <algorithm>

namespace kiln::nn {

TransformerBlock::TransformerBlock(const std::string& prefix, const BlockSpec& spec)
    : spec_(spec),
      norm_1_(prefix + spec.names.norm_1, spec.n_embd, spec.norm),
      norm_2_(prefix + spec.names.norm_2, spec.n_embd, spec.norm),
      attn_(prefix + spec.names.attn_qkv, prefix + spec.names.attn_out, spec.n_embd,
            spec.attention, spec.bias, spec.init_std, spec.residual_init_std,
            prefix + spec.names.attn_q_norm, prefix + spec.names.attn_k_norm) {
  if (spec.moe.enabled())
    moe_.emplace(prefix + spec.names.moe, spec.n_embd, spec.moe, spec.init_std,
                 spec.residual_init_std);
  else
    mlp_.emplace(spec.mlp, prefix + spec.names.mlp_fc, prefix + spec.names.mlp_proj,
                 spec.n_embd, spec.mlp_hidden, spec.bias, spec.init_std, spec.residual_init_std);
  kAttn = kNorm1 + norm_1_.num_saved();
  kResidual = kAttn + attn_.num_saved();
  kNorm2 = kResidual + 1;
  kMlp = kNorm2 + norm_2_.num_saved();
  kNumSaved = kMlp + (moe_ ? moe_->num_saved() : Mlp::kNumSaved);
  KILN_CHECK(spec.n_embd > 0 && (moe_ || spec.mlp_hidden > 0),
             "block: n_embd {} and mlp_hidden {} must be > 0", spec.n_embd, spec.mlp_hidden);
}

DropoutSpec TransformerBlock::rows(const DropoutSpec& d, const Tensor& x) const {
  return tp_ ? rows_dropout(d, TpPlacement{TpStyle::Sequence, tp_, sp_}, x.numel()) : d;
}

void TransformerBlock::shard(const BlockPlacement& placement) {
  attn_.shard(placement.attention);
  if (mlp_) mlp_->shard(placement.mlp);
  if (moe_) moe_->shard(placement.mlp);
  norm_1_.shard(placement.norms);
  norm_2_.shard(placement.norms);
  for (const TpPlacement* p : {&placement.norms, &placement.attention.qkv,
                               &placement.attention.proj, &placement.mlp.fc, &placement.mlp.proj}) {
    if (!p->active()) continue;
    tp_ = p->group;
    sp_ = sp_ || p->sequence_parallel;
  }
  const bool mlp_split = mlp_ ? mlp_->proj.placement().active() : moe_->sequence_parallel();
  KILN_CHECK(!sp_ || (placement.norms.style == TpStyle::Sequence &&
                      attn_.proj.placement().active() && mlp_split),
             "{}: sequence parallelism needs the norms sequence-parallel and the attention and "
             "MLP split (column then row)", norm_1_.name());
}

std::pair<int64_t, int64_t> TransformerBlock::residual_bt(int64_t B, int64_t T) const {
  if (!sequence_parallel()) return {B, T};
  KILN_CHECK((B * T) % tp_->size() == 0,
             "block: {} rows of [B, T] do not divide over tp = {} (sequence parallelism)", B * T,
             tp_->size());
  return {1, B * T / tp_->size()};
}

Shape TransformerBlock::residual_shape(int64_t B, int64_t T) const {
  const auto [rb, rt] = residual_bt(B, T);
  return sequence_parallel() ? Shape{rt, spec_.n_embd} : Shape{rb, rt, spec_.n_embd};
}

std::vector<SavedSpec> TransformerBlock::saved_specs(int64_t B, int64_t T, DType dtype) const {
  const auto [rb, rt] = residual_bt(B, T);  // the residual stream's side
  std::vector<SavedSpec> out = norm_1_.saved_specs(rb, rt, dtype);
  for (auto& sp : attn_.saved_specs(B, T, dtype)) out.push_back(sp);
  out.push_back({norm_2_.name() + ":in", Shape{rb, rt, spec_.n_embd}, dtype, Recompute::WithBlock});
  for (auto& sp : norm_2_.saved_specs(rb, rt, dtype)) out.push_back(sp);
  for (auto& sp : moe_ ? moe_->saved_specs(B, T, dtype) : mlp_->saved_specs(B, T, dtype))
    out.push_back(sp);
  KILN_CHECK(out.size() == kNumSaved, "block: {} saved tensors, expected {}", out.size(), kNumSaved);
  return out;
}

BlockScratch TransformerBlock::make_scratch(Backend& be, int64_t B, int64_t T, DType dtype) const {
  const int64_t C = spec_.n_embd;
  const int64_t big = std::max(mlp_ ? mlp_->fc_width() : 0, attn_.local_spec().qkv_width());
  auto act = [&](Shape s) { return be.empty(s, dtype, MemCategory::Activations); };
  const bool swiglu = mlp_ && spec_.mlp == MlpKind::SwiGLU;
  BlockScratch w{act({B, T, C}), act({B, T, C}), act({B, T, attn_.dattn_width()}),
                 act({B, T, big}), swiglu ? act({B, T, mlp_->hidden()}) : Tensor(),
                 sequence_parallel() ? act({B * T, C}) : Tensor()};
  if (moe_) w.moe = moe_->make_scratch(be, B, T, dtype);
  return w;
}

BlockScratch TransformerBlock::make_scratch(Backend& be, std::span<const TransformerBlock> blocks,
                                            int64_t B, int64_t T, DType dtype) {
  KILN_CHECK(!blocks.empty(), "block scratch: no blocks");
  const auto is_moe = [](const TransformerBlock& b) { return b.moe() != nullptr; };
  const auto dense = std::find_if_not(blocks.begin(), blocks.end(), is_moe);
  const auto moe = std::find_if(blocks.begin(), blocks.end(), is_moe);
  if (dense == blocks.end() || moe == blocks.end()) return blocks.front().make_scratch(be, B, T, dtype);
  BlockScratch w = dense->make_scratch(be, B, T, dtype);
  w.moe = moe->moe_->make_scratch(be, B, T, dtype);
  return w;
}

void TransformerBlock::forward(const BlockPass& p, const Tensor& x, const Tensor& out) const {
  run(p, x, out, /*recomputing=*/false);
}

void TransformerBlock::run(const BlockPass& p, const Tensor& x, const Tensor& out,
                           bool recomputing) const {
  Backend& be = p.be;
  const auto n1 = part(p.saved, kNorm1, norm_1_.num_saved());
  const auto at = part(p.saved, kAttn, attn_.num_saved());
  const auto n2 = part(p.saved, kNorm2, norm_2_.num_saved());
  const auto ml = part(p.saved, kMlp, kNumSaved - kMlp);
  const Tensor& residual = p.saved[kResidual];
  const Tensor tmp = p.scratch.tmp.view_at(0, x.shape());
  const Tensor& work = p.scratch.work;
  norm_1_.forward(be, p.s, n1, x);
  attn_.forward(be, p.s, at, tmp, n1[Norm::kOut], p.positions, p.cu_seqlens, p.attn_probs,
                work);
  if (p.attn_resid.enabled()) be.dropout_forward(p.s, tmp, tmp, rows(p.attn_resid, x));
  be.add(p.s, residual, x, tmp);
  norm_2_.forward(be, p.s, n2, residual);
  if (moe_)
    moe_->forward(be, p.s, ml, tmp, n2[Norm::kOut], p.scratch.moe, p.balance, recomputing);
  else
    mlp_->forward(be, p.s, ml, tmp, n2[Norm::kOut], work);
  if (p.mlp_resid.enabled()) be.dropout_forward(p.s, tmp, tmp, rows(p.mlp_resid, x));
  be.add(p.s, out, residual, tmp);
}

void TransformerBlock::backward(const BlockPass& p, const Tensor& dres, const Tensor& x,
                                const Tensor& out) const {
  Backend& be = p.be;
  const auto n1 = part(p.saved, kNorm1, norm_1_.num_saved());
  const auto at = part(p.saved, kAttn, attn_.num_saved());
  const auto n2 = part(p.saved, kNorm2, norm_2_.num_saved());
  const Tensor& residual = p.saved[kResidual];
  const BlockScratch& w = p.scratch;
  // Recompute what forward did not keep: the same kernels on the same inputs with the
  // same masks, so bitwise forward's tensors.
  if (p.rerun) {
    run(p, x, out, /*recomputing=*/true);
  } else if (p.recompute_cheap) {
    const auto ml = part(p.saved, kMlp, kNumSaved - kMlp);
    if (moe_)
      moe_->recompute(be, p.s, ml, n2[Norm::kOut], w.moe);
    else
      mlp_->recompute(be, p.s, ml);
  }
  const int64_t B = w.tmp.size(0), T = w.tmp.size(1);
  const Tensor tmp = w.tmp.view_at(0, x.shape()), dtmp = w.dtmp.view_at(0, x.shape());
  // MLP: out = residual + dropout(mlp(norm_2(residual))).
  Tensor d_out = dres;
  if (p.mlp_resid.enabled()) {
    be.dropout_backward(p.s, tmp, dres, rows(p.mlp_resid, x));
    d_out = tmp;
  }
  mlp_backward(p, dtmp, d_out, n2[Norm::kOut]);
  norm_2_.backward(be, p.s, n2, dres, dtmp, residual);
  // Attention: residual = x + dropout(attn(norm_1(x))).
  d_out = dres;
  if (p.attn_resid.enabled()) {
    be.dropout_backward(p.s, tmp, dres, rows(p.attn_resid, x));
    d_out = tmp;
  }
  const Tensor dqkv = w.dbig.view_at(0, Shape{B, T, attn_.local_spec().qkv_width()});
  attn_.backward(be, p.s, at, dtmp, d_out, n1[Norm::kOut], w.dattn, dqkv, p.positions,
                 p.cu_seqlens, p.attn_probs, w.work);
  norm_1_.backward(be, p.s, n1, dres, dtmp, x);
}

void TransformerBlock::mlp_backward(const BlockPass& p, const Tensor& dtmp, const Tensor& d_out,
                                    const Tensor& inp) const {
  const auto ml = part(p.saved, kMlp, kNumSaved - kMlp);
  const BlockScratch& w = p.scratch;
  if (moe_) {
    moe_->backward(p.be, p.s, ml, dtmp, d_out, inp, w.moe, p.balance);
    return;
  }
  const int64_t B = w.tmp.size(0), T = w.tmp.size(1);
  const Tensor dh = w.dbig.view_at(0, Shape{B, T, mlp_->fc_width()});
  mlp_->backward(p.be, p.s, ml, dtmp, d_out, inp, dh, w.dact, w.work);
}

TransformerBlock::DecodeScratch TransformerBlock::make_decode_scratch(Backend& be, int64_t B,
                                                                      int64_t Tq,
                                                                      DType dtype) const {
  const int64_t C = spec_.n_embd, H = spec_.mlp_hidden;
  const int64_t fc = spec_.mlp == MlpKind::SwiGLU ? 2 * H : H;  // a dense block's (no tp)
  auto tmp = [&](Shape s) { return be.empty(s, dtype, MemCategory::Temporaries); };
  DecodeScratch w;
  w.x2 = tmp({B, Tq, C});
  w.norm = tmp({B, Tq, C});
  w.y = tmp({B, Tq, C});
  w.qkv = tmp({B, Tq, spec_.attention.qkv_width()});
  w.attn = tmp({B, Tq, spec_.attention.q_width()});
  w.hidden = tmp({B, Tq, fc});
  w.act = tmp({B, Tq, H});
  w.mean = be.empty(Shape{B * Tq}, DType::F32, MemCategory::Temporaries);
  w.rstd = be.empty(Shape{B * Tq}, DType::F32, MemCategory::Temporaries);
  return w;
}

void TransformerBlock::decode(Backend& be, Stream s, const Tensor& x, const DecodeScratch& w,
                              const Tensor& k_cache, const Tensor& v_cache, int64_t past,
                              const Tensor& positions) const {
  KILN_CHECK(!tp_, "{}: decoding a tensor-parallel block is not supported yet", norm_1_.name());
  norm_1_.forward_into(be, s, w.norm, w.mean, w.rstd, x);
  attn_.decode(be, s, w.norm, w.norm, w.qkv, w.attn, k_cache, v_cache, past, positions);
  be.add(s, w.x2, x, w.norm);
  norm_2_.forward_into(be, s, w.norm, w.mean, w.rstd, w.x2);
  if (moe_)
    moe_->decode(be, s, w.y, w.norm);
  else
    mlp_->decode(be, s, w.y, w.norm, w.hidden, w.act);
  be.add(s, x, w.x2, w.y);
}

std::vector<TransformerBlock::RoleLinear> TransformerBlock::linears() {
  std::vector<RoleLinear> out = {{"attention.qkv", &attn_.qkv}, {"attention.proj", &attn_.proj}};
  if (mlp_) out.insert(out.end(), {{"mlp.fc", &mlp_->fc}, {"mlp.proj", &mlp_->proj}});
  return out;
}

void TransformerBlock::collect(std::vector<Param*>& out) {
  norm_1_.collect(out);
  attn_.collect(out);
  norm_2_.collect(out);
  if (moe_)
    moe_->collect(out);
  else
    mlp_->collect(out);
}

}  // namespace kiln::nn

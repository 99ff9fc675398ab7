#include "models/mmdit/joint_text_encoder.h"

#include <fmt/format.h>

namespace kiln {

namespace {

nn::BlockSpec text_block_spec(const MMDiTConfig& c) {
  nn::BlockSpec b;
  b.n_embd = c.n_embd;
  b.norm = nn::NormSpec{nn::NormKind::LayerNorm, c.norm_eps, true, true};
  b.attention.n_head = c.n_head;
  b.attention.n_kv_head = c.n_head;
  b.attention.head_dim = c.n_embd / c.n_head;
  b.attention.causal = false;
  b.mlp = nn::MlpKind::GeluTanh;
  b.mlp_hidden = c.ffn_hidden_size;
  b.init_std = 0.02f;
  b.residual_init_std = 0.02f;
  return b;
}

}  // namespace

JointTextEncoder::JointTextEncoder(const MMDiTConfig& c)
    : C_(c.n_embd),
      Lc_(c.caption_tokens),
      embed_("text_encoder.wte.weight", "text_encoder.wpe.weight", c.vocab_size, c.vocab_size,
             c.caption_tokens, c.n_embd, 0.02f),
      ln_f_("text_encoder.ln_f", c.n_embd, nn::NormSpec{nn::NormKind::LayerNorm, c.norm_eps}) {
  const nn::BlockSpec spec = text_block_spec(c);
  blocks_.reserve(static_cast<size_t>(c.text_layers));
  for (int l = 0; l < c.text_layers; ++l)
    blocks_.emplace_back(fmt::format("text_encoder.h.{}.", l), spec);
}

void JointTextEncoder::collect(std::vector<nn::Param*>& out) {
  embed_.collect(out);
  for (auto& b : blocks_) b.collect(out);
  ln_f_.collect(out);
}

double JointTextEncoder::cost_per_position() const {
  const double C = static_cast<double>(C_);
  double w = 0;
  for (const auto& b : blocks_) w += 4.0 * C * C + 2.0 * C * static_cast<double>(b.spec().mlp_hidden);
  return w;
}

void JointTextEncoder::reserve(Backend& be, int B, DType dtype, nn::ActivationCheckpointing mode) {
  if (B_ == B && dtype_ == dtype && mode_ == mode && !stream_.empty()) return;
  stream_.clear();  // free first so the peak is not doubled
  lnf_.clear();
  B_ = B;
  dtype_ = dtype;
  mode_ = mode;
  auto act = [&](Shape sh) { return be.empty(sh, dtype, MemCategory::Activations); };
  for (size_t l = 0; l <= blocks_.size(); ++l) stream_.push_back(act(Shape{B, Lc_, C_}));
  for (const nn::SavedSpec& sp : ln_f_.saved_specs(B, Lc_, dtype))
    lnf_.push_back(be.empty(sp.shape, sp.dtype, MemCategory::Activations));
  if (!blocks_.empty()) {
    saved_.reserve(be, blocks_.front().saved_specs(B, Lc_, dtype), static_cast<int>(blocks_.size()),
                   mode);
    scratch_ = blocks_.front().make_scratch(be, B, Lc_, dtype);
  }
  dres_ = act(Shape{B, Lc_, C_});
}

nn::BlockPass JointTextEncoder::pass(Backend& be, Stream s, int l, const Tensor& cu_seqlens) const {
  return {be,       s, saved_.block(l), scratch_, {}, {}, {}, saved_.rerun_block(),
          saved_.recompute_cheap(), Tensor(), cu_seqlens, {}};
}

void JointTextEncoder::forward(Backend& be, Stream s, const Tensor& tokens, const Tensor& cu_seqlens) {
  embed_.forward(be, s, stream_.front(), tokens);
  for (size_t l = 0; l < blocks_.size(); ++l)
    blocks_[l].forward(pass(be, s, static_cast<int>(l), cu_seqlens), stream_[l], stream_[l + 1]);
  ln_f_.forward(be, s, lnf_, stream_.back());
}

void JointTextEncoder::backward(Backend& be, Stream s, const Tensor& denc, const Tensor& tokens,
                           const Tensor& cu_seqlens) {
  be.fill(s, dres_, 0.f);
  ln_f_.backward(be, s, lnf_, dres_, denc, stream_.back());
  for (size_t l = blocks_.size(); l-- > 0;)
    blocks_[l].backward(pass(be, s, static_cast<int>(l), cu_seqlens), dres_, stream_[l],
                        stream_[l + 1]);
  embed_.backward(be, s, dres_, tokens);
}

}  // namespace kiln

// The MMDiT's frozen Llama text encoder (text.encoder = "llama"): a Llama decoder's hidden
// states as the caption's encoding, as SD3 reads a frozen T5's and Lumina / Sana read a
// decoder LM's,
//
//   h_0  = embed_tokens[tokens]            tokens int32 [B,Lc]; padding -1 (a zero row)
//   h_l+1 = layer_l(h_l)                   Llama's blocks (RMSNorm, rotary positions 0..,
//                                          causal grouped-query attention within the
//                                          caption, SwiGLU); the padding a document of
//                                          its own (cu_seqlens)
//   enc  = norm(h_L) [B,Lc,Ct]             Ct = text.n_embd
//
// Causal: the caption's last token has read all of it (what the MMDiT pools). Parameters,
// Hugging Face's LlamaForCausalLM names under text_encoder. (models/llama/llama.h; no
// lm_head): text_encoder.model.embed_tokens.weight [Vp, Ct],
// text_encoder.model.layers.{l}.*, text_encoder.model.norm.weight. All frozen (no
// gradient, no optimizer state, saved with the model's checkpoints); they start as a
// Llama's random init and are meant to be loaded with model.init_parts =
// ["text_encoder=PATH"], PATH a kiln Llama checkpoint or a Hugging Face Llama folder whose
// tokenizer made the captions. Forward only: backward has nothing to do.
#pragma once

#include "models/llama_layers.h"
#include "models/mmdit/text_encoder.h"
#include "nn/block.h"

#include <vector>

namespace kiln {

class LlamaTextEncoder final : public TextEncoder {
 public:
  /// The Llama of c.text_llama.
  explicit LlamaTextEncoder(const MMDiTConfig& c);

  void collect(std::vector<nn::Param*>& out) override;
  double cost_per_position() const override;
  /// Keeps no activation for backward whatever `mode` says (one block's worth of scratch).
  void reserve(Backend& be, int B, DType dtype, nn::ActivationCheckpointing mode) override;
  /// output() [B,Lc,Ct].
  void forward(Backend& be, Stream s, const Tensor& tokens, const Tensor& cu_seqlens) override;
  const Tensor& output() const override { return norm_[nn::Norm::kOut]; }
  /// Frozen: nothing.
  void backward(Backend&, Stream, const Tensor&, const Tensor&, const Tensor&) override {}

 private:
  LlamaConfig config_;
  int64_t Lc_;
  LlamaLayers layers_;
  int B_ = 0;
  DType dtype_ = DType::F32;
  Tensor x_[2];               // the residual stream [B,Lc,Ct], block l reads x_[l % 2]
  std::vector<Tensor> norm_;  // the final norm's out (enc), rstd
  nn::SavedActivations saved_;  // one block's, shared (nothing is kept for backward)
  nn::BlockScratch scratch_;
};

}  // namespace kiln

// The MMDiT's joint text encoder (text.encoder = "joint"), trained with the model (SD3
// reads frozen CLIP and T5 encoders instead; llama_text_encoder.h reads a frozen Llama): a
// bidirectional GPT-2 style transformer over a caption's Lc text slots,
//
//   h_0     = wte[tokens] + wpe[0 .. Lc-1]      tokens int32 [B,Lc]; padding -1 (a zero row)
//   h_{l+1} = block_l(h_l)                      pre-LN, GELU MLP, bidirectional attention
//                                               within the caption: its padding is a document
//                                               of its own (cu_seqlens)
//   enc     = ln_f(h_L) [B,Lc,C]
//
// Parameters (GPT-2's names under text_encoder.): wte.weight [V, C], wpe.weight [Lc, C],
// h.{l}.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.{weight, bias},
// ln_f.{weight, bias}; matrices and tables N(0, 0.02^2), biases 0, norm gains 1.
#pragma once

#include "models/mmdit/text_encoder.h"
#include "nn/block.h"
#include "nn/embedding.h"
#include "nn/norm.h"
#include "nn/saved.h"

#include <vector>

namespace kiln {

class JointTextEncoder final : public TextEncoder {
 public:
  explicit JointTextEncoder(const MMDiTConfig& c);

  void collect(std::vector<nn::Param*>& out) override;
  double cost_per_position() const override;
  void reserve(Backend& be, int B, DType dtype, nn::ActivationCheckpointing mode) override;
  /// output() [B,Lc,C].
  void forward(Backend& be, Stream s, const Tensor& tokens, const Tensor& cu_seqlens) override;
  const Tensor& output() const override { return lnf_[nn::Norm::kOut]; }
  void backward(Backend& be, Stream s, const Tensor& denc, const Tensor& tokens,
                const Tensor& cu_seqlens) override;

 private:
  nn::BlockPass pass(Backend& be, Stream s, int l, const Tensor& cu_seqlens) const;
  int64_t C_, Lc_;
  nn::TokenPositionEmbedding embed_;
  std::vector<nn::TransformerBlock> blocks_;
  nn::Norm ln_f_;
  int B_ = 0;
  DType dtype_ = DType::F32;
  nn::ActivationCheckpointing mode_ = nn::ActivationCheckpointing::None;
  std::vector<Tensor> stream_;  // h_0 .. h_L [B,Lc,C]
  std::vector<Tensor> lnf_;     // ln_f's out (enc), mean, rstd
  nn::SavedActivations saved_;
  nn::BlockScratch scratch_;
  Tensor dres_;                 // [B,Lc,C]
};

}  // namespace kiln

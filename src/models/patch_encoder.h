// A vision transformer's trunk (Dosovitskiy et al. 2021), shared by the ViT classifier
// (models/vit/vit.h) and the LLaVA vision tower (models/llava/llava.h) as the families
// share files at the top of models/ (decoder_model.h, vision_config.h):
//
//   patches [B, T, D] = patchify(images [B,H,W,Cin])      D = Cin P^2 (Backend::patchify);
//                                                         rows >= N (N patches) stay zero
//   x0 [B, T, C]      = patch_embed(patches) + pos_embed  T = N + extra tokens
//   x_{l+1}           = block_l(x_l)   pre-LN, bidirectional multi-head attention, GELU MLP
//
// An extra token's input row is all zeros, so its embedding is patch_embed.bias +
// pos_embed[t], a learned vector (ViT's class token). GELU is the tanh approximation.
// Parameters, after the owner's prefix, as timm's VisionTransformer names them:
//   patch_embed.proj.weight [C, D] (a [C, Cin, P, P] convolution's, flattened),
//   patch_embed.proj.bias [C], pos_embed [T, C],
//   blocks.{l}.norm1.{weight,bias}, blocks.{l}.attn.qkv.{weight,bias} [3C, C],
//   blocks.{l}.attn.proj.{weight,bias} [C, C], blocks.{l}.norm2.{weight,bias},
//   blocks.{l}.mlp.fc1.{weight,bias} [H, C], blocks.{l}.mlp.fc2.{weight,bias} [C, H]
// Initialisation: matrices and pos_embed N(0, 0.02^2), the two residual projections
// N(0, (0.02 / sqrt(2 L))^2), biases 0, norm gains 1.
#pragma once

#include "models/layered_model.h"
#include "models/vision_config.h"
#include "nn/block.h"
#include "nn/linear.h"
#include "nn/saved.h"

#include <string>
#include <vector>

namespace kiln {

/// What a pass through the trunk keeps for one micro_batch B.
struct PatchActivations {
  int B = 0;
  Tensor patches;              // [B,T,D] model dtype; rows >= N stay 0
  Tensor pos_ids;              // int32 [B,T]: t (the rows of pos_embed)
  std::vector<Tensor> stream;  // [0] embeddings, [1 + l] block l's output, [B,T,C] each
  nn::SavedActivations saved;
  nn::BlockScratch scratch;
};

class PatchEncoder {
 public:
  /// The trunk of `c` (its n_layer, widths and patches) over `tokens` positions (the
  /// patches and any extra tokens after them), its parameters named after `prefix`.
  PatchEncoder(const VisionShape& c, int tokens, const std::string& prefix);

  /// Appends its parts: "embeddings" (patch_embed, pos_embed), then "blocks.{l}". Costs:
  /// the matmul weights a position meets in the part (the 6N rule's N).
  void add_parts(std::vector<PartLayout>& out);
  /// (Re)allocates `a` for B images in `dtype` under `mode` (unchanged B and mode: kept).
  void reserve(Backend& be, PatchActivations& a, int B, DType dtype,
               nn::ActivationCheckpointing mode) const;
  /// a.stream[0 .. n_blocks] of images fp32 [B,H,W,Cin] (B as reserved), through the first
  /// n_blocks blocks; `hooks` (nullptr: none) around the embeddings (part first_part) and
  /// block l (part first_part + 1 + l). Throws kiln::Error for images of another shape.
  void forward(Backend& be, Stream s, PatchActivations& a, const Tensor& images, int n_blocks,
               ModelHooks* hooks = nullptr, int first_part = 0) const;
  /// Accumulates the parameters' gradients from dx = dL/d(a.stream[n_blocks]) [B,T,C]
  /// (overwritten) of the last forward; no gradient for the images.
  void backward(Backend& be, Stream s, PatchActivations& a, const Tensor& dx, int n_blocks,
                ModelHooks* hooks = nullptr, int first_part = 0) const;

  int tokens() const { return tokens_; }
  int n_layer() const { return static_cast<int>(blocks_.size()); }
  int64_t n_embd() const { return shape_.n_embd; }

 private:
  nn::BlockPass pass(Backend& be, Stream s, const PatchActivations& a, int l) const;

  VisionShape shape_;
  int tokens_;
  nn::Linear patch_embed_;
  nn::Param pos_embed_;
  std::vector<nn::TransformerBlock> blocks_;
};

}  // namespace kiln

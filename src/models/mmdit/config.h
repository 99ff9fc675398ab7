// Text-conditioned diffusion transformer (MMDiT: Esser et al. 2024, "Scaling Rectified
// Flow Transformers for High-Resolution Image Synthesis"; Stable Diffusion 3)
// hyper-parameters, parameter count and training FLOPs.
//
// The image side is the DiT's (models/dit/config.h): square images of image_size pixels
// and num_channels channels cut into patch_size patches, N = (image_size / patch_size)^2
// positions (block_size), the timestep through a frequency_dim-wide sinusoidal embedding
// and a 2-layer MLP. The text side: captions of at most caption_tokens tokens of a
// vocab_size vocabulary (the data's), read by a text encoder (model.text.encoder):
//   "joint"  a bidirectional transformer of text.n_layer blocks trained with the rest
//            (n_embd wide, n_head heads, ffn_hidden_size MLP; text_encoder.h);
//   "llama"  a frozen Llama decoder's final-norm hidden states (Ct = text.n_embd wide,
//            causal; its shape the [model] text.* keys, Llama's keys under "text."; its
//            weights from a kiln Llama checkpoint or a Hugging Face Llama folder through
//            model.init_parts = ["text_encoder=PATH"]),
// whose output [Lc, Ct] enters the joint blocks through a linear context embedder (Ct ->
// C) and, pooled at the caption's last token, the conditioning vector. A caption becomes the empty one (the
// null condition of classifier-free guidance, Ho & Salimans 2022) with probability
// caption_dropout while training. n_layer joint blocks; the last one's context stream is
// pre-only (SD3).
#pragma once

#include "models/llama_config.h"
#include "models/vision_config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace kiln {

enum class TextEncoderKind { Joint, Llama };

struct MMDiTConfig : VisionShape {
  MMDiTConfig() {
    patch_size = 4;
    norm_eps = 1e-6f;  // DiT's LayerNorm epsilon
    num_classes = 0;   // conditioned on text, not labels
  }
  int frequency_dim = 256;      // F, the sinusoidal timestep embedding's width (even)
  int vocab_size = 0;           // V, the captions' vocabulary
  int caption_tokens = 32;      // Lc, the text slots (the longest caption)
  int text_layers = 2;          // blocks of the text encoder (0: embeddings and a norm)
  float caption_dropout = 0.1f;  // probability that a training caption becomes empty
  TextEncoderKind text_encoder = TextEncoderKind::Joint;
  /// text_encoder Llama: the decoder's shape (text.n_layer = text_layers blocks,
  /// vocab_size, block_size caption_tokens, tied: it has no head).
  LlamaConfig text_llama;

  int tokens() const { return patches(); }
  /// Ct, the width of the text encoder's output: n_embd, or the Llama's.
  int text_width() const;
  /// Throws kiln::Error naming the [model] key of an impossible shape.
  void validate() const;
  int64_t num_parameters() const;
  /// Training FLOPs per image position (T = N): 6 x the matmul weights an image position
  /// meets plus those a caption position meets (the context stream's and embedder's)
  /// times Lc / N, plus the per-image matmuls (timestep and pooled-text MLPs, every
  /// adaLN) spread over the N positions; attention 12 L (N + Lc)^2 C / N for the joint
  /// blocks; and the text encoder's text_flops_per_position() times Lc / N.
  double flops_per_token(int T) const;
  /// The text encoder's FLOPs per caption position and training step: the joint one's
  /// 6 x its matmul weights + 12 text_layers Lc C (attention); the frozen Llama's forward
  /// only, 2 x its blocks' matmul weights + 4 text_layers Lc NH HD.
  double text_flops_per_position() const;
  std::string str() const;
};

/// MMDiT's [model] keys (ModelArch::keys): vision_keys() but num_classes, caption_tokens,
/// caption_dropout, text.encoder, text.n_layer, text.n_head, text.n_embd and Llama's own
/// keys but moe.* and tie_embeddings under "text." (text.n_kv_head, text.rope_theta, ...;
/// for text.encoder = "llama" only).
const ModelKeys& mmdit_keys();
/// The MMDiT of the [model] keys (ffn_hidden_size 0 -> 4 n_embd), validated. Throws
/// kiln::Error naming the key for an impossible shape, block_size other than the patch
/// count, no vocabulary, dropout or rotary settings, a Llama's text.* key with the joint
/// encoder.
MMDiTConfig mmdit_config_of(const ModelOptions& options);
nlohmann::json mmdit_config_json(const MMDiTConfig& c);
ModelOptions mmdit_options_from_json(const nlohmann::json& j);

}  // namespace kiln

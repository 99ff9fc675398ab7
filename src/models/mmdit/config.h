// Text-conditioned diffusion transformer (MMDiT: Esser et al. 2024, "Scaling Rectified
// Flow Transformers for High-Resolution Image Synthesis"; Stable Diffusion 3)
// hyper-parameters, parameter count and training FLOPs.
//
// The image side is the DiT's (models/dit/config.h): square images of image_size pixels
// and num_channels channels cut into patch_size patches, N = (image_size / patch_size)^2
// positions (block_size), the timestep through a frequency_dim-wide sinusoidal embedding
// and a 2-layer MLP. The text side: captions of at most caption_tokens tokens of a
// vocab_size vocabulary (the data's), read by a bidirectional transformer of text.n_layer
// blocks trained with the rest (n_embd wide, n_head heads, ffn_hidden_size MLP), whose
// output enters the joint blocks through a linear context embedder and, pooled at the
// caption's last token, the conditioning vector. A caption becomes the empty one (the
// null condition of classifier-free guidance, Ho & Salimans 2022) with probability
// caption_dropout while training. n_layer joint blocks; the last one's context stream is
// pre-only (SD3).
#pragma once

#include "models/vision_config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace kiln {

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

  int tokens() const { return patches(); }
  /// Throws kiln::Error naming the [model] key of an impossible shape.
  void validate() const;
  int64_t num_parameters() const;
  /// Training FLOPs per image position (T = N): 6 x the matmul weights an image position
  /// meets plus those a caption position meets (the text encoder's, the context stream's)
  /// times Lc / N, plus the per-image matmuls (timestep and pooled-text MLPs, every
  /// adaLN) spread over the N positions; attention 12 L (N + Lc)^2 C / N for the joint
  /// blocks and 12 text_layers Lc^2 C / N for the encoder.
  double flops_per_token(int T) const;
  std::string str() const;
};

/// MMDiT's [model] keys (ModelArch::keys): vision_keys() but num_classes, caption_tokens,
/// caption_dropout and text.n_layer.
const ModelKeys& mmdit_keys();
/// The MMDiT of the [model] keys (ffn_hidden_size 0 -> 4 n_embd), validated. Throws
/// kiln::Error naming the key for an impossible shape, block_size other than the patch
/// count, no vocabulary, dropout or rotary settings.
MMDiTConfig mmdit_config_of(const ModelOptions& options);
nlohmann::json mmdit_config_json(const MMDiTConfig& c);
ModelOptions mmdit_options_from_json(const nlohmann::json& j);

}  // namespace kiln

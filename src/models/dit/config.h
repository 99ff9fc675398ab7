// Diffusion transformer (DiT, Peebles & Xie 2023, "Scalable Diffusion Models with
// Transformers") hyper-parameters, parameter count and training FLOPs.
//
// Square images of image_size pixels and num_channels channels are cut into patch_size
// patches: T = N = (image_size / patch_size)^2 positions (block_size), no class token. The
// timestep enters as a frequency_dim-wide sinusoidal embedding (DiT's 256) through a
// 2-layer MLP; the class label through an embedding of num_classes + 1 rows (the last one
// the "null" class of classifier-free guidance, Ho & Salimans 2022, which a training
// label becomes with probability class_dropout). The MLP is 4 C wide unless
// ffn_hidden_size says otherwise. The model predicts the velocity of a rectified flow.
#pragma once

#include "models/vision_config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace kiln {

/// VisionShape's keys (patch_size 4 and norm_eps 1e-6 by default, DiT's), and the
/// timestep and label conditioning.
struct DiTConfig : VisionShape {
  DiTConfig() {
    patch_size = 4;
    norm_eps = 1e-6f;  // DiT's LayerNorm epsilon
  }
  int frequency_dim = 256;    // F, the sinusoidal timestep embedding's width (even)
  float class_dropout = 0.1f;  // probability that a training label becomes the null class

  int tokens() const { return patches(); }
  /// Throws kiln::Error naming the [model] key of an impossible shape.
  void validate() const;
  int64_t num_parameters() const;
  /// Training FLOPs per position at length T: 6 N + 12 L T C, N the matmul weights a
  /// position meets (patch projection D x C and the final D x C, per block 4 C^2 + 2 C H),
  /// plus the per-image matmuls (timestep MLP F C + C^2, adaLN 6 C^2 per block and 2 C^2
  /// final) spread over the T positions.
  double flops_per_token(int T) const;
  std::string str() const;
};

/// DiT's [model] keys (ModelArch::keys): vision_keys() and class_dropout.
const ModelKeys& dit_keys();
/// The DiT of the [model] keys (ffn_hidden_size 0 -> 4 n_embd, norm_eps taken as given),
/// validated. Throws kiln::Error naming the key for an impossible shape, block_size other
/// than the patch count, a vocabulary, dropout or rotary settings.
DiTConfig dit_config_of(const ModelOptions& options);
nlohmann::json dit_config_json(const DiTConfig& c);
ModelOptions dit_options_from_json(const nlohmann::json& j);

}  // namespace kiln

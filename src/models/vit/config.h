// Vision transformer (ViT, Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words")
// hyper-parameters, parameter count and training FLOPs.
//
// Square images of image_size pixels and num_channels channels are cut into patch_size
// patches: N = (image_size / patch_size)^2 patches plus one class token, so a sequence
// has T = N + 1 = block_size positions. The MLP is 4 C wide unless ffn_hidden_size says
// otherwise; num_classes output classes.
#pragma once

#include "models/vision_config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace kiln {

/// VisionShape's keys (patch_size 7, norm_eps 1e-5 by default), and a class token.
struct ViTConfig : VisionShape {
  /// Positions of a sequence: the patches, then the class token.
  int tokens() const { return patches() + 1; }
  /// Throws kiln::Error naming the [model] key of an impossible shape.
  void validate() const;
  /// Trainable parameters (every tensor of the model; nothing is padded or tied).
  int64_t num_parameters() const;
  /// Training FLOPs per token (sequence position) at length T: 6 N + 12 L T C, N the
  /// matmul weights a position meets (the patch projection D x C, per block 12 C^2 with
  /// a 4C MLP, in general 4 C^2 + 2 C H), the attention term as GPT-2's; the classifier
  /// (K x C, once per image) spread over the T positions.
  double flops_per_token(int T) const;
  std::string str() const;
};

/// The ViT of the [model] keys (ffn_hidden_size 0 -> 4 n_embd), validated. Throws
/// kiln::Error naming the key for an impossible shape, block_size other than the
/// sequence length (patches + 1), a vocabulary, or dropout > 0 (not implemented).
ViTConfig vit_config_of(const ModelOptions& options);
/// Hyper-parameters as stored in a checkpoint's state ("model" object), and back.
nlohmann::json vit_config_json(const ViTConfig& c);
ModelOptions vit_options_from_json(const nlohmann::json& j);

}  // namespace kiln

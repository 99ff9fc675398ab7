// What the image models' configs (vit/, dit/) share: the [model] keys of a transformer on
// square images cut into patches, their checks and their form in a checkpoint's state.
#pragma once

#include "models/model_options.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace kiln {

/// The shape a vision transformer on square images cut into patches has, whatever it
/// predicts (ViTConfig, DiTConfig derive from it and set their own defaults).
struct VisionShape {
  int n_layer = 2;
  int n_head = 4;
  int n_embd = 64;            // C; head size C / n_head
  int ffn_hidden_size = 256;  // H
  int image_size = 28;        // pixels (height = width)
  int num_channels = 1;
  int patch_size = 7;         // P
  int num_classes = 10;       // K
  float norm_eps = 1e-5f;     // LayerNorm epsilon

  /// N = (image_size / patch_size)^2.
  int patches() const { return (image_size / patch_size) * (image_size / patch_size); }
  /// Elements of one flattened patch: num_channels * patch_size^2.
  int patch_dim() const { return num_channels * patch_size * patch_size; }
  /// Throws kiln::Error naming the [model] key (and `arch`) of an impossible shape;
  /// num_classes must be at least `min_classes`.
  void validate_shape(const std::string& arch, int min_classes) const;
};

/// The [model] keys of an image model (ModelArch::keys of vit and dit): ffn_hidden_size,
/// norm_eps, image_size, num_channels, patch_size, num_classes.
const ModelKeys& vision_keys();

/// Refuses what an image model has no use for: a family key `keys` (the arch's) does not
/// declare, and a vocabulary; names the key and `arch`.
void check_vision_options(const ModelOptions& o, const ModelKeys& keys, const std::string& arch);

/// The shape keys of state.model (n_layer, n_head, n_embd, ffn_hidden_size, image_size,
/// num_channels, patch_size, num_classes, block_size, norm_eps) into `o`. Throws
/// kiln::Error naming a missing or malformed key.
void read_vision_json(const nlohmann::json& j, ModelOptions& o);

/// Those keys of a ViTConfig or DiTConfig `c` (block_size = c.tokens()).
template <class Config>
nlohmann::json vision_json(const Config& c) {
  return {{"n_layer", c.n_layer},       {"n_head", c.n_head},
          {"n_embd", c.n_embd},         {"ffn_hidden_size", c.ffn_hidden_size},
          {"image_size", c.image_size}, {"num_channels", c.num_channels},
          {"patch_size", c.patch_size}, {"num_classes", c.num_classes},
          {"block_size", c.tokens()},   {"norm_eps", c.norm_eps}};
}

/// Throws kiln::Error unless model.block_size is the patch count of `c` (the image models
/// without a class token: dit, mmdit), naming `arch`.
void check_patch_block_size(const ModelOptions& o, const VisionShape& c, const std::string& arch);
/// Copies the shape keys of `o` into `c` (ffn_hidden_size 0 -> 4 n_embd); `keys` are the
/// arch's (vision_keys() and its own; without num_classes, c.num_classes is 0).
void copy_vision_options(const ModelOptions& o, const ModelKeys& keys, VisionShape& c);

}  // namespace kiln


// What the image models' configs (vit/, dit/) share: the [model] keys of a transformer on
// square images cut into patches, their checks and their form in a checkpoint's state.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace kiln {

struct ModelOptions;

/// Refuses the language-model keys an image model has no use for (grouped-query
/// attention, tied embeddings, rotary settings, a vocabulary), naming the key and `arch`.
void check_vision_options(const ModelOptions& o, const std::string& arch);

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

/// Copies the shape keys of `o` into `c` (ffn_hidden_size 0 -> 4 n_embd).
template <class Config>
void copy_vision_options(const ModelOptions& o, Config& c);

}  // namespace kiln

#include "models/model_options.h"

namespace kiln {

template <class Config>
void copy_vision_options(const ModelOptions& o, Config& c) {
  c.n_layer = o.n_layer;
  c.n_head = o.n_head;
  c.n_embd = o.n_embd;
  c.ffn_hidden_size = o.ffn_hidden_size > 0 ? o.ffn_hidden_size : 4 * o.n_embd;
  c.image_size = o.image_size;
  c.num_channels = o.num_channels;
  c.patch_size = o.patch_size;
  c.num_classes = o.num_classes;
  c.norm_eps = o.norm_eps;
}

}  // namespace kiln

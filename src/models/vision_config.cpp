#include "models/vision_config.h"

#include "core/error.h"
#include "core/json_util.h"
#include "models/model_options.h"

#include <fmt/format.h>

namespace kiln {

void VisionShape::validate_shape(const std::string& arch, int min_classes) const {
  KILN_CHECK(n_layer > 0, "model.n_layer must be positive for {} (got {})", arch, n_layer);
  KILN_CHECK(n_head > 0 && n_embd > 0 && n_embd % n_head == 0,
             "model.n_embd ({}) must be a positive multiple of model.n_head ({})", n_embd, n_head);
  KILN_CHECK(ffn_hidden_size > 0, "model.ffn_hidden_size must be positive (got {})", ffn_hidden_size);
  KILN_CHECK(image_size > 0 && num_channels > 0,
             "{}: model.image_size ({}) and model.num_channels ({}) must be positive (0 takes "
             "them from the image data set)", arch, image_size, num_channels);
  KILN_CHECK(patch_size > 0 && image_size % patch_size == 0,
             "model.patch_size ({}) must be positive and divide model.image_size ({})", patch_size,
             image_size);
  KILN_CHECK(num_classes >= min_classes, "model.num_classes must be {} for {} (got {})",
             min_classes == 1 ? "positive" : fmt::format("at least {}", min_classes), arch,
             num_classes);
  KILN_CHECK(norm_eps > 0.f, "model.norm_eps must be positive (got {})", norm_eps);
}

void copy_vision_options(const ModelOptions& o, VisionShape& c) {
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

void check_vision_options(const ModelOptions& o, const std::string& arch) {
  KILN_CHECK(o.n_kv_head == 0 || o.n_kv_head == o.n_head,
             "model.n_kv_head ({}): {} uses multi-head attention (set 0)", o.n_kv_head, arch);
  KILN_CHECK(!o.tie_embeddings, "model.tie_embeddings: {} has no token embedding to tie", arch);
  KILN_CHECK(o.rope.scale_factor == 0.0 && o.rope.theta == RopeSpec{}.theta,
             "model.rope_theta / model.rope_scaling: {} has learned positions, no rotary (leave "
             "them unset)", arch);
  KILN_CHECK(o.vocab_size == 0 || o.vocab_size == o.num_classes,
             "model.vocab_size ({}): {} reads images, not tokens (leave it 0)", o.vocab_size, arch);
}

void read_vision_json(const nlohmann::json& j, ModelOptions& o) {
  auto integer = [&](const char* key) {
    return static_cast<int>(json_integer_field(j, key, "state.model", INT32_MIN, INT32_MAX));
  };
  o.n_layer = integer("n_layer");
  o.n_head = integer("n_head");
  o.n_embd = integer("n_embd");
  o.ffn_hidden_size = integer("ffn_hidden_size");
  o.image_size = integer("image_size");
  o.num_channels = integer("num_channels");
  o.patch_size = integer("patch_size");
  o.num_classes = integer("num_classes");
  o.block_size = integer("block_size");
  o.norm_eps = j.at("norm_eps");
}

}  // namespace kiln

#include "models/vision_config.h"

#include "core/error.h"
#include "core/json_util.h"

namespace kiln {

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

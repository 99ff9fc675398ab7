#include "models/dit/config.h"
#include "models/registry.h"

#include "core/error.h"
#include "core/json_util.h"

#include <fmt/format.h>

namespace kiln {

void DiTConfig::validate() const {
  KILN_CHECK(n_layer > 0, "model.n_layer must be positive for dit (got {})", n_layer);
  KILN_CHECK(n_head > 0 && n_embd > 0 && n_embd % n_head == 0,
             "model.n_embd ({}) must be a positive multiple of model.n_head ({})", n_embd, n_head);
  KILN_CHECK(ffn_hidden_size > 0, "model.ffn_hidden_size must be positive (got {})", ffn_hidden_size);
  KILN_CHECK(image_size > 0 && num_channels > 0,
             "dit: model.image_size ({}) and model.num_channels ({}) must be positive (0 takes "
             "them from the image data set)", image_size, num_channels);
  KILN_CHECK(patch_size > 0 && image_size % patch_size == 0,
             "model.patch_size ({}) must be positive and divide model.image_size ({})", patch_size,
             image_size);
  KILN_CHECK(num_classes > 0, "model.num_classes must be positive for dit (got {})", num_classes);
  KILN_CHECK(frequency_dim > 0 && frequency_dim % 2 == 0,
             "dit: the timestep frequency width ({}) must be positive and even", frequency_dim);
  KILN_CHECK(class_dropout >= 0.f && class_dropout < 1.f,
             "model.class_dropout ({}) must be in [0, 1)", class_dropout);
  KILN_CHECK(norm_eps > 0.f, "model.norm_eps must be positive (got {})", norm_eps);
}

int64_t DiTConfig::num_parameters() const {
  const int64_t C = n_embd, L = n_layer, H = ffn_hidden_size, D = patch_dim(), F = frequency_dim;
  const int64_t block = (3 * C * C + 3 * C) + (C * C + C) + (C * H + H) + (H * C + C) +
                        (6 * C * C + 6 * C);
  const int64_t embed = D * C + C + int64_t{tokens()} * C + (F * C + C) + (C * C + C) +
                        int64_t{num_classes + 1} * C;
  const int64_t final_layer = (2 * C * C + 2 * C) + (D * C + D);
  return embed + L * block + final_layer;
}

double DiTConfig::flops_per_token(int T) const {
  const double C = n_embd, L = n_layer, H = ffn_hidden_size, D = patch_dim(), F = frequency_dim;
  const double per_image = F * C + C * C + L * 6.0 * C * C + 2.0 * C * C;
  const double matmul = 2.0 * D * C + L * (4.0 * C * C + 2.0 * C * H) + per_image / T;
  return 6.0 * matmul + 12.0 * L * static_cast<double>(T) * C;
}

std::string DiTConfig::str() const {
  return fmt::format("DiT n_layer={} n_head={} n_embd={} ffn={} image={}x{}x{} patch={} ({} "
                     "patches) classes={} class_dropout={} params={:.3f}M",
                     n_layer, n_head, n_embd, ffn_hidden_size, image_size, image_size,
                     num_channels, patch_size, patches(), num_classes, class_dropout,
                     num_parameters() / 1e6);
}

DiTConfig dit_config_of(const ModelOptions& o) {
  KILN_CHECK(o.dropout == 0.f, "model.dropout ({}): dit has no dropout (its label dropout is "
             "model.class_dropout)", o.dropout);
  KILN_CHECK(o.n_kv_head == 0 || o.n_kv_head == o.n_head,
             "model.n_kv_head ({}): dit uses multi-head attention (set 0)", o.n_kv_head);
  KILN_CHECK(!o.tie_embeddings, "model.tie_embeddings: dit has no token embedding to tie");
  KILN_CHECK(o.rope.scale_factor == 0.0 && o.rope.theta == RopeSpec{}.theta,
             "model.rope_theta / model.rope_scaling: dit has learned positions, no rotary (leave "
             "them unset)");
  DiTConfig c;
  c.n_layer = o.n_layer;
  c.n_head = o.n_head;
  c.n_embd = o.n_embd;
  c.ffn_hidden_size = o.ffn_hidden_size > 0 ? o.ffn_hidden_size : 4 * o.n_embd;
  c.image_size = o.image_size;
  c.num_channels = o.num_channels;
  c.patch_size = o.patch_size;
  c.num_classes = o.num_classes;
  c.class_dropout = o.class_dropout;
  c.norm_eps = o.norm_eps;
  c.validate();
  KILN_CHECK(o.block_size == c.tokens(),
             "model.block_size ({}) must be {} for dit: {} patches of {}x{} in a {}x{} image",
             o.block_size, c.tokens(), c.patches(), c.patch_size, c.patch_size, c.image_size,
             c.image_size);
  KILN_CHECK(o.vocab_size == 0 || o.vocab_size == c.num_classes,
             "model.vocab_size ({}): dit reads images, not tokens (leave it 0)", o.vocab_size);
  return c;
}

nlohmann::json dit_config_json(const DiTConfig& c) {
  return {{"n_layer", c.n_layer},           {"n_head", c.n_head},
          {"n_embd", c.n_embd},             {"ffn_hidden_size", c.ffn_hidden_size},
          {"image_size", c.image_size},     {"num_channels", c.num_channels},
          {"patch_size", c.patch_size},     {"num_classes", c.num_classes},
          {"block_size", c.tokens()},       {"norm_eps", c.norm_eps},
          {"class_dropout", c.class_dropout}, {"frequency_dim", c.frequency_dim}};
}

ModelOptions dit_options_from_json(const nlohmann::json& j) {
  ModelOptions o;
  o.arch = "dit";
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
  KILN_CHECK(integer("frequency_dim") == DiTConfig{}.frequency_dim,
             "state.model.frequency_dim must be {}", DiTConfig{}.frequency_dim);
  o.norm_eps = j.at("norm_eps");
  o.class_dropout = j.at("class_dropout");
  dit_config_of(o);  // validates
  return o;
}

}  // namespace kiln

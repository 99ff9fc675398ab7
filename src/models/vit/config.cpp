#include "models/vit/config.h"
#include "models/model_options.h"
#include "models/vision_config.h"

#include "core/error.h"
#include "core/json_util.h"

#include <fmt/format.h>

namespace kiln {

void ViTConfig::validate() const { validate_shape("vit", /*min_classes=*/2); }

int64_t ViTConfig::num_parameters() const {
  const int64_t C = n_embd, L = n_layer, H = ffn_hidden_size, D = patch_dim();
  const int64_t block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (C * H + H) + (H * C + C);
  return D * C + C + int64_t{tokens()} * C + L * block + 2 * C + int64_t{num_classes} * C;
}

double ViTConfig::flops_per_token(int T) const {
  const double C = n_embd, L = n_layer, H = ffn_hidden_size;
  const double matmul = patch_dim() * C + L * (4.0 * C * C + 2.0 * C * H) +
                        static_cast<double>(num_classes) * C / T;
  return 6.0 * matmul + 12.0 * L * static_cast<double>(T) * C;
}

std::string ViTConfig::str() const {
  return fmt::format("ViT n_layer={} n_head={} n_embd={} ffn={} image={}x{}x{} patch={} ({} "
                     "patches + class token) classes={} params={:.3f}M",
                     n_layer, n_head, n_embd, ffn_hidden_size, image_size, image_size,
                     num_channels, patch_size, patches(), num_classes, num_parameters() / 1e6);
}

ViTConfig vit_config_of(const ModelOptions& o) {
  KILN_CHECK(o.dropout == 0.f, "model.dropout ({}): vit has no dropout yet (set 0)", o.dropout);
  check_vision_options(o, vision_keys(), "vit");
  ViTConfig c;
  copy_vision_options(o, vision_keys(), c);
  c.validate();
  KILN_CHECK(o.block_size == c.tokens(),
             "model.block_size ({}) must be {} for vit: {} patches of {}x{} in a {}x{} image, "
             "plus the class token", o.block_size, c.tokens(), c.patches(), c.patch_size,
             c.patch_size, c.image_size, c.image_size);
  return c;
}

nlohmann::json vit_config_json(const ViTConfig& c) { return vision_json(c); }

ModelOptions vit_options_from_json(const nlohmann::json& j) {
  ModelOptions o;
  o.arch = "vit";
  read_vision_json(j, o);
  vit_config_of(o);  // validates
  return o;
}

}  // namespace kiln

#include "models/dit/config.h"
#include "models/model_options.h"
#include "models/vision_config.h"

#include "core/error.h"
#include "core/json_util.h"

#include <fmt/format.h>

namespace kiln {

const ModelKeys& dit_keys() {
  static const ModelKeys keys = [] {
    ModelKeys k = vision_keys();
    k.push_back({.name = "class_dropout", .type = ModelKeyType::Float, .default_value = 0.1,
                 .lo = 0, .hi = 1, .hi_open = true,
                 .description = "dit: probability that a training label is replaced by the null "
                                "class (classifier-free guidance)."});
    return k;
  }();
  return keys;
}

void DiTConfig::validate() const {
  validate_shape("dit", /*min_classes=*/1);
  KILN_CHECK(frequency_dim > 0 && frequency_dim % 2 == 0,
             "dit: the timestep frequency width ({}) must be positive and even", frequency_dim);
  KILN_CHECK(class_dropout >= 0.f && class_dropout < 1.f,
             "model.class_dropout ({}) must be in [0, 1)", class_dropout);
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
  check_vision_options(o, dit_keys(), "dit");
  DiTConfig c;
  copy_vision_options(o, dit_keys(), c);
  c.class_dropout = static_cast<float>(o.value(dit_keys(), "class_dropout"));
  c.validate();
  check_patch_block_size(o, c, "dit");
  return c;
}

nlohmann::json dit_config_json(const DiTConfig& c) {
  nlohmann::json j = vision_json(c);
  j["class_dropout"] = c.class_dropout;
  j["frequency_dim"] = c.frequency_dim;
  return j;
}

ModelOptions dit_options_from_json(const nlohmann::json& j) {
  ModelOptions o;
  o.arch = "dit";
  read_vision_json(j, o);
  KILN_CHECK(json_integer_field(j, "frequency_dim", "state.model", 0, INT32_MAX) ==
                 DiTConfig{}.frequency_dim,
             "state.model.frequency_dim must be {}", DiTConfig{}.frequency_dim);
  o.family["class_dropout"] = j.at("class_dropout").get<float>();
  dit_config_of(o);  // validates
  return o;
}

}  // namespace kiln

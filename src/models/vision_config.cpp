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

const ModelKeys& vision_keys() {
  using enum ModelKeyType;
  static const ModelKeys keys{
      {.name = "ffn_hidden_size", .type = Integer, .lo = 0,
       .description = "MLP hidden width; 0 = the architecture's default (vit, dit: 4 n_embd)."},
      {.name = "norm_eps", .type = Float, .default_value = 1e-5, .lo = 0, .lo_open = true,
       .description = "LayerNorm epsilon (vit, dit)."},
      {.name = "image_size", .type = Integer, .lo = 0,
       .description = "Image height = width in pixels (vit, dit); 0 = take it from the image "
                      "data set."},
      {.name = "num_channels", .type = Integer, .lo = 0,
       .description = "Image channels (vit, dit: 1 gray, 3 RGB); 0 = take it from the image "
                      "data set."},
      {.name = "patch_size", .type = Integer, .lo = 0,
       .description = "Patch side in pixels (vit, dit); must divide image_size; block_size = "
                      "(image_size / patch_size)^2 + 1 for vit (the patches and the class "
                      "token), (image_size / patch_size)^2 for dit."},
      {.name = "num_classes", .type = Integer, .lo = 0,
       .description = "Classes of an image classifier (vit) or class-conditional generator "
                      "(dit); 0 = take it from the image data set."},
  };
  return keys;
}

void copy_vision_options(const ModelOptions& o, const ModelKeys& keys, VisionShape& c) {
  c.n_layer = o.n_layer;
  c.n_head = o.n_head;
  c.n_embd = o.n_embd;
  const int ffn = o.integer(keys, "ffn_hidden_size");
  c.ffn_hidden_size = ffn > 0 ? ffn : 4 * o.n_embd;
  c.image_size = o.integer(keys, "image_size");
  c.num_channels = o.integer(keys, "num_channels");
  c.patch_size = o.integer(keys, "patch_size");
  c.num_classes = find_model_key(keys, "num_classes") ? o.integer(keys, "num_classes") : 0;
  c.norm_eps = static_cast<float>(o.value(keys, "norm_eps"));
}

void check_patch_block_size(const ModelOptions& o, const VisionShape& c, const std::string& arch) {
  KILN_CHECK(o.block_size == c.patches(),
             "model.block_size ({}) must be {} for {}: {} patches of {}x{} in a {}x{} image",
             o.block_size, c.patches(), arch, c.patches(), c.patch_size, c.patch_size,
             c.image_size, c.image_size);
}

void check_vision_options(const ModelOptions& o, const ModelKeys& keys, const std::string& arch) {
  check_family_keys(o, keys);
  const int num_classes = o.integer(keys, "num_classes");
  KILN_CHECK(o.vocab_size == 0 || o.vocab_size == num_classes,
             "model.vocab_size ({}): {} reads images, not tokens (leave it 0)", o.vocab_size, arch);
}

void read_vision_json(const nlohmann::json& j, ModelOptions& o) {
  auto integer = [&](const char* key) {
    return static_cast<int>(json_integer_field(j, key, "state.model", INT32_MIN, INT32_MAX));
  };
  o.n_layer = integer("n_layer");
  o.n_head = integer("n_head");
  o.n_embd = integer("n_embd");
  o.block_size = integer("block_size");
  for (const char* key : {"ffn_hidden_size", "image_size", "num_channels", "patch_size", "num_classes"})
    o.family[key] = integer(key);
  o.family["norm_eps"] = j.at("norm_eps").get<float>();
}

}  // namespace kiln

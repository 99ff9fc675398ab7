#include "models/llava/config.h"

#include "core/error.h"
#include "core/json_util.h"

#include <fmt/format.h>

#include <string_view>

namespace kiln {

namespace {

constexpr std::string_view kVision = "vision.";

// The vision tower's own keys (beyond image_size and num_channels, vision_keys()'s).
const ModelKeys& vision_tower_keys() {
  using enum ModelKeyType;
  static const ModelKeys keys{
      {.name = "vision.n_layer", .type = Integer, .default_value = 2, .lo = 1,
       .description = "Transformer blocks of the vision tower (llava)."},
      {.name = "vision.n_head", .type = Integer, .default_value = 4, .lo = 1,
       .description = "Attention heads of the vision tower (llava); must divide vision.n_embd."},
      {.name = "vision.n_embd", .type = Integer, .default_value = 64, .lo = 1,
       .description = "Width of the vision tower (llava)."},
      {.name = "vision.ffn_hidden_size", .type = Integer, .lo = 0,
       .description = "MLP hidden width of the vision tower (llava); 0 = 4 vision.n_embd."},
      {.name = "vision.patch_size", .type = Integer, .default_value = 7, .lo = 1,
       .description = "Patch side in pixels (llava); must divide image_size. The image takes "
                      "(image_size / vision.patch_size)^2 of the decoder's block_size "
                      "positions."},
      {.name = "vision.norm_eps", .type = Float, .default_value = 1e-5, .lo = 0, .lo_open = true,
       .description = "LayerNorm epsilon of the vision tower (llava)."},
      {.name = "vision.feature_layer", .type = Integer, .default_value = -1, .hi = -1,
       .description = "The vision block whose output the projector reads, from the end "
                      "(llava): -1 the last, -2 the penultimate (LLaVA-1.5's "
                      "vision_feature_layer), -(vision.n_layer + 1) the embeddings; later "
                      "blocks do not run."},
  };
  return keys;
}

// image_size and num_channels (filled from an image-text data set).
const ModelKeys& image_keys() {
  static const ModelKeys keys = [] {
    ModelKeys out;
    for (const ModelKey& k : vision_keys())
      if (k.name == "image_size" || k.name == "num_channels") out.push_back(k);
    return out;
  }();
  return keys;
}

// The decoder's options: o without the vision keys, as a Llama's.
ModelOptions text_options(const ModelOptions& o) {
  ModelOptions t = o;
  t.arch = "llama";
  for (auto it = t.family.begin(); it != t.family.end();) {
    const bool vision = it->first.starts_with(kVision) || it->first == "image_size" ||
                        it->first == "num_channels";
    it = vision ? t.family.erase(it) : std::next(it);
  }
  return t;
}

}  // namespace

const ModelKeys& llava_keys() {
  static const ModelKeys keys = [] {
    ModelKeys out = llama_keys();
    for (const ModelKeys* more : {&vision_tower_keys(), &image_keys()})
      out.insert(out.end(), more->begin(), more->end());
    return out;
  }();
  return keys;
}

void llava_check_options(const ModelOptions& o, const KeySource& source) {
  llama_check_options(text_options(o), source);
  const ModelKeys& k = llava_keys();
  const int layers = o.integer(k, "vision.n_layer"), feature = o.integer(k, "vision.feature_layer");
  KILN_CHECK(-feature <= layers + 1, "{}: model.vision.feature_layer = {} is past the vision "
             "tower's {} blocks (model.vision.n_layer; -{} is its embeddings)",
             source("model.vision.feature_layer"), feature, layers, layers + 1);
}

void LlavaConfig::validate() const {
  text.validate();
  // The vision tower's shape under its own keys (validate_shape names the image models').
  KILN_CHECK(vision.n_embd > 0 && vision.n_head > 0 && vision.n_embd % vision.n_head == 0,
             "model.vision.n_embd ({}) must be a positive multiple of model.vision.n_head ({})",
             vision.n_embd, vision.n_head);
  KILN_CHECK(vision.patch_size > 0 && vision.image_size % vision.patch_size == 0,
             "model.vision.patch_size ({}) must be positive and divide model.image_size ({})",
             vision.patch_size, vision.image_size);
  vision.validate_shape("llava", /*min_classes=*/0);
  KILN_CHECK(feature_layer <= -1 && vision_blocks() >= 0,
             "model.vision.feature_layer ({}) must be in [-{}, -1] (the vision tower's blocks, "
             "-{} its embeddings)", feature_layer, vision.n_layer + 1, vision.n_layer + 1);
  KILN_CHECK(text.block_size > image_tokens(),
             "model.block_size ({}) must exceed the image's {} tokens ((image_size {} / "
             "vision.patch_size {})^2): a sequence is the image's tokens and the text's",
             text.block_size, image_tokens(), vision.image_size, vision.patch_size);
  KILN_CHECK(!text.moe.enabled(), "llava: a mixture-of-experts decoder (model.moe.num_experts "
             "= {}) is not implemented yet", text.moe.num_experts);
}

int64_t LlavaConfig::num_parameters() const {
  const int64_t Cv = vision.n_embd, H = vision.ffn_hidden_size, C = text.n_embd;
  const int64_t block = 4 * Cv * Cv + 2 * Cv * H + 9 * Cv + H;
  const int64_t tower = int64_t{vision.patch_dim()} * Cv + Cv + int64_t{image_tokens()} * Cv +
                        vision.n_layer * block;
  return text.num_parameters() + tower + Cv * C + C + C * C + C;
}

double LlavaConfig::flops_per_token(int T) const {
  const double Cv = vision.n_embd, H = vision.ffn_hidden_size, C = text.n_embd;
  const double N = image_tokens(), Lv = vision_blocks();
  const double tower = 6.0 * (vision.patch_dim() * Cv + Lv * (4.0 * Cv * Cv + 2.0 * Cv * H)) +
                       12.0 * Lv * N * Cv;
  const double projector = 6.0 * (Cv * C + C * C);
  return text.flops_per_token(T) + N * (tower + projector) / T;
}

std::string LlavaConfig::str() const {
  return fmt::format("LLaVA vision: n_layer={} (feature layer {}) n_head={} n_embd={} ffn={} "
                     "image={}x{}x{} patch={} ({} image tokens); decoder: {}; params={:.3f}M",
                     vision.n_layer, feature_layer, vision.n_head, vision.n_embd,
                     vision.ffn_hidden_size, vision.image_size, vision.image_size,
                     vision.num_channels, vision.patch_size, image_tokens(), text.str(),
                     num_parameters() / 1e6);
}

LlavaConfig llava_config_of(const ModelOptions& o) {
  check_family_keys(o, llava_keys());
  const ModelKeys& k = llava_keys();
  LlavaConfig c;
  c.text = llama_config_of(text_options(o));
  c.vision.n_layer = o.integer(k, "vision.n_layer");
  c.vision.n_head = o.integer(k, "vision.n_head");
  c.vision.n_embd = o.integer(k, "vision.n_embd");
  const int ffn = o.integer(k, "vision.ffn_hidden_size");
  c.vision.ffn_hidden_size = ffn > 0 ? ffn : 4 * c.vision.n_embd;
  c.vision.image_size = o.integer(k, "image_size");
  c.vision.num_channels = o.integer(k, "num_channels");
  c.vision.patch_size = o.integer(k, "vision.patch_size");
  c.vision.num_classes = 0;
  c.vision.norm_eps = static_cast<float>(o.value(k, "vision.norm_eps"));
  c.feature_layer = o.integer(k, "vision.feature_layer");
  c.validate();
  return c;
}

nlohmann::json llava_config_json(const LlavaConfig& c) {
  nlohmann::json j = llama_config_json(c.text);
  j["vision"] = {{"n_layer", c.vision.n_layer},
                 {"n_head", c.vision.n_head},
                 {"n_embd", c.vision.n_embd},
                 {"ffn_hidden_size", c.vision.ffn_hidden_size},
                 {"image_size", c.vision.image_size},
                 {"num_channels", c.vision.num_channels},
                 {"patch_size", c.vision.patch_size},
                 {"norm_eps", c.vision.norm_eps},
                 {"feature_layer", c.feature_layer}};
  return j;
}

ModelOptions llava_options_from_json(const nlohmann::json& j) {
  nlohmann::json text = j;
  text.erase("vision");
  ModelOptions o = llama_options_from_json(text);
  o.arch = "llava";
  KILN_CHECK(j.contains("vision") && j.at("vision").is_object(),
             "state.model: no \"vision\" object (a llava's vision tower)");
  const nlohmann::json& v = j.at("vision");
  auto integer = [&](const char* key) {
    return static_cast<double>(json_integer_field(v, key, "state.model.vision", INT32_MIN, INT32_MAX));
  };
  for (const char* key : {"n_layer", "n_head", "n_embd", "ffn_hidden_size", "patch_size", "feature_layer"})
    o.family[fmt::format("vision.{}", key)] = integer(key);
  o.family["image_size"] = integer("image_size");
  o.family["num_channels"] = integer("num_channels");
  o.family["vision.norm_eps"] = v.at("norm_eps").get<float>();
  llava_config_of(o);  // validates
  return o;
}

}  // namespace kiln

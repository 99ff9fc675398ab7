#include "models/mmdit/config.h"

#include "core/error.h"
#include "core/json_util.h"

#include <fmt/format.h>

namespace kiln {

const ModelKeys& mmdit_keys() {
  using enum ModelKeyType;
  static const ModelKeys keys = [] {
    ModelKeys k;
    for (const ModelKey& v : vision_keys())
      if (v.name != "num_classes") k.push_back(v);
    k.push_back({.name = "caption_tokens", .type = Integer, .default_value = 32, .lo = 1,
                 .description = "mmdit: the caption's text slots (its longest caption, the "
                                "end-of-text token included)."});
    k.push_back({.name = "caption_dropout", .type = Float, .default_value = 0.1, .lo = 0, .hi = 1,
                 .hi_open = true,
                 .description = "mmdit: probability that a training caption becomes the empty "
                                "one (classifier-free guidance).",
                 .training_only = true});
    k.push_back({.name = "text.n_layer", .type = Integer, .default_value = 2, .lo = 0,
                 .description = "mmdit: blocks of the bidirectional text encoder trained with "
                                "the model (n_embd wide, n_head heads); 0 = its embeddings and "
                                "a norm."});
    return k;
  }();
  return keys;
}

void MMDiTConfig::validate() const {
  validate_shape("mmdit", /*min_classes=*/0);
  KILN_CHECK(frequency_dim > 0 && frequency_dim % 2 == 0,
             "mmdit: the timestep frequency width ({}) must be positive and even", frequency_dim);
  KILN_CHECK(vocab_size > 0, "model.vocab_size must be positive for mmdit (0 takes it from the "
             "image-text data set)");
  KILN_CHECK(caption_tokens > 0, "model.caption_tokens must be positive (got {})", caption_tokens);
  KILN_CHECK(text_layers >= 0, "model.text.n_layer must be >= 0 (got {})", text_layers);
  KILN_CHECK(caption_dropout >= 0.f && caption_dropout < 1.f,
             "model.caption_dropout ({}) must be in [0, 1)", caption_dropout);
}

int64_t MMDiTConfig::num_parameters() const {
  const int64_t C = n_embd, L = n_layer, H = ffn_hidden_size, D = patch_dim(), F = frequency_dim;
  const int64_t N = tokens(), Lc = caption_tokens, V = vocab_size;
  const int64_t stream = (3 * C * C + 3 * C) + (C * C + C) + (C * H + H) + (H * C + C) +
                         (6 * C * C + 6 * C);
  const int64_t pre_only = (3 * C * C + 3 * C) + (2 * C * C + 2 * C);
  const int64_t text_block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (C * H + H) + (H * C + C);
  const int64_t text = V * C + Lc * C + int64_t{text_layers} * text_block + 2 * C;
  const int64_t frame = (D * C + C) + N * C + (F * C + C) + (C * C + C) + (2 * C * C + 2 * C) +
                        (D * C + D);
  const int64_t text_conditioning = (C * C + C) + 2 * (C * C + C);  // context, y embedders
  return frame + text + text_conditioning + L * 2 * stream - (stream - pre_only);
}

double MMDiTConfig::flops_per_token(int T) const {
  const double C = n_embd, L = n_layer, H = ffn_hidden_size, D = patch_dim(), F = frequency_dim;
  const double N = T, Lc = caption_tokens, Lt = text_layers;
  const double block = 4.0 * C * C + 2.0 * C * H;  // a stream's matmuls per position
  const double per_caption_position = (L - 1) * block + 3.0 * C * C + Lt * block + C * C;
  const double per_image = F * C + C * C + 2.0 * C * C + L * 12.0 * C * C - 4.0 * C * C +
                           2.0 * C * C;
  const double matmul = 2.0 * D * C + L * block + Lc / N * per_caption_position + per_image / N;
  return 6.0 * matmul + 12.0 * L * (N + Lc) * (N + Lc) * C / N + 12.0 * Lt * Lc * Lc * C / N;
}

std::string MMDiTConfig::str() const {
  return fmt::format("MMDiT n_layer={} n_head={} n_embd={} ffn={} image={}x{}x{} patch={} ({} "
                     "patches) vocab={} caption_tokens={} text.n_layer={} caption_dropout={} "
                     "params={:.3f}M",
                     n_layer, n_head, n_embd, ffn_hidden_size, image_size, image_size,
                     num_channels, patch_size, patches(), vocab_size, caption_tokens, text_layers,
                     caption_dropout, num_parameters() / 1e6);
}

MMDiTConfig mmdit_config_of(const ModelOptions& o) {
  KILN_CHECK(o.dropout == 0.f, "model.dropout ({}): mmdit has no dropout (its caption dropout "
             "is model.caption_dropout)", o.dropout);
  const ModelKeys& keys = mmdit_keys();
  check_family_keys(o, keys);
  MMDiTConfig c;
  copy_vision_options(o, keys, c);
  c.vocab_size = o.vocab_size;
  c.caption_tokens = o.integer(keys, "caption_tokens");
  c.text_layers = o.integer(keys, "text.n_layer");
  c.caption_dropout = static_cast<float>(o.value(keys, "caption_dropout"));
  c.validate();
  check_patch_block_size(o, c, "mmdit");
  return c;
}

nlohmann::json mmdit_config_json(const MMDiTConfig& c) {
  nlohmann::json j = vision_json(c);
  j["frequency_dim"] = c.frequency_dim;
  j["vocab_size"] = c.vocab_size;
  j["caption_tokens"] = c.caption_tokens;
  j["text.n_layer"] = c.text_layers;
  j["caption_dropout"] = c.caption_dropout;
  return j;
}

ModelOptions mmdit_options_from_json(const nlohmann::json& j) {
  ModelOptions o;
  o.arch = "mmdit";
  read_vision_json(j, o);
  o.family.erase("num_classes");
  KILN_CHECK(json_integer_field(j, "frequency_dim", "state.model", 0, INT32_MAX) ==
                 MMDiTConfig{}.frequency_dim,
             "state.model.frequency_dim must be {}", MMDiTConfig{}.frequency_dim);
  o.vocab_size = static_cast<int>(json_integer_field(j, "vocab_size", "state.model", 1, INT32_MAX));
  o.family["caption_tokens"] =
      static_cast<double>(json_integer_field(j, "caption_tokens", "state.model", 1, INT32_MAX));
  o.family["text.n_layer"] =
      static_cast<double>(json_integer_field(j, "text.n_layer", "state.model", 0, INT32_MAX));
  KILN_CHECK(j.contains("caption_dropout") && j["caption_dropout"].is_number(),
             "state.model: \"caption_dropout\" must be a number");
  o.family["caption_dropout"] = j["caption_dropout"].get<double>();
  mmdit_config_of(o);  // validates
  return o;
}

}  // namespace kiln

#include "models/mmdit/config.h"

#include "core/error.h"
#include "core/json_util.h"

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace kiln {

namespace {

constexpr std::string_view kText = "text.";

// The text.* keys the joint encoder reads too; the others are the Llama's.
bool shared_text_key(std::string_view name) {
  return name == "text.encoder" || name == "text.n_layer";
}

// Llama's own keys under "text." (not moe.*, not tie_embeddings: the encoder has no head).
ModelKeys llama_text_keys() {
  using enum ModelKeyType;
  ModelKeys out{
      {.name = "text.n_head", .type = Integer, .lo = 0,
       .description = "mmdit, text.encoder = \"llama\": the Llama's attention heads; 0 = "
                      "n_head."},
      {.name = "text.n_embd", .type = Integer, .lo = 0,
       .description = "mmdit, text.encoder = \"llama\": the Llama's width (Ct, what the "
                      "context and pooled-text embedders read); 0 = n_embd."},
  };
  for (ModelKey k : llama_keys()) {
    if (k.name.starts_with("moe.") || k.name == "tie_embeddings") continue;
    k.description = fmt::format("mmdit, text.encoder = \"llama\": the Llama's {} ({})", k.name,
                                k.description);
    k.name = std::string(kText) + k.name;
    out.push_back(std::move(k));
  }
  return out;
}

// The Llama text encoder's options: text.n_layer, text.n_head, text.n_embd and the text.*
// Llama keys as a Llama's, its vocabulary the captions', its positions the caption slots.
ModelOptions llama_text_options(const ModelOptions& o, const ModelKeys& keys) {
  ModelOptions t;
  t.arch = "llama";
  t.n_layer = o.integer(keys, "text.n_layer");
  const int heads = o.integer(keys, "text.n_head"), width = o.integer(keys, "text.n_embd");
  t.n_head = heads > 0 ? heads : o.n_head;
  t.n_embd = width > 0 ? width : o.n_embd;
  t.vocab_size = o.vocab_size;
  t.block_size = o.integer(keys, "caption_tokens");
  for (const auto& [name, value] : o.family) {
    if (!name.starts_with(kText) || shared_text_key(name) || name == "text.n_head" ||
        name == "text.n_embd")
      continue;
    t.family[name.substr(kText.size())] = value;
  }
  t.family["tie_embeddings"] = 1.0;  // no head: the embedding is all it reads
  return t;
}

}  // namespace

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
    k.push_back({.name = "text.encoder", .type = Choice,
                 .description = "mmdit: the text encoder. \"joint\": a bidirectional "
                                "transformer trained with the model (GPT-2 blocks, n_embd "
                                "wide, n_head heads); \"llama\": a frozen Llama decoder's "
                                "final-norm hidden states (causal), shaped by the text.* keys, "
                                "its weights from model.init_parts = [\"text_encoder=PATH\"] "
                                "(a kiln Llama checkpoint or a Hugging Face Llama folder of "
                                "the data's tokenizer).",
                 .choices = {"joint", "llama"}});
    k.push_back({.name = "text.n_layer", .type = Integer, .default_value = 2, .lo = 0,
                 .description = "mmdit: blocks of the text encoder (joint: 0 = its embeddings "
                                "and a norm; llama: the Llama's n_layer, >= 1)."});
    for (ModelKey& t : llama_text_keys()) k.push_back(std::move(t));
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
  if (text_encoder != TextEncoderKind::Llama) return;
  KILN_CHECK(text_llama.n_layer == text_layers && text_llama.vocab_size == vocab_size &&
                 text_llama.block_size >= caption_tokens && text_llama.tie_embeddings &&
                 !text_llama.moe.enabled(),
             "mmdit: the Llama text encoder ({}) must have text.n_layer ({}) blocks, the "
             "captions' vocabulary ({}), caption_tokens ({}) positions, no head and no experts",
             text_llama.str(), text_layers, vocab_size, caption_tokens);
  KILN_CHECK(text_layers >= 1, "model.text.n_layer must be >= 1 for text.encoder = \"llama\"");
}

int MMDiTConfig::text_width() const {
  return text_encoder == TextEncoderKind::Llama ? text_llama.n_embd : n_embd;
}

int64_t MMDiTConfig::num_parameters() const {
  const int64_t C = n_embd, L = n_layer, H = ffn_hidden_size, D = patch_dim(), F = frequency_dim;
  const int64_t N = tokens(), Lc = caption_tokens, V = vocab_size;
  const int64_t stream = (3 * C * C + 3 * C) + (C * C + C) + (C * H + H) + (H * C + C) +
                         (6 * C * C + 6 * C);
  const int64_t pre_only = (3 * C * C + 3 * C) + (2 * C * C + 2 * C);
  const int64_t text_block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (C * H + H) + (H * C + C);
  const int64_t text = text_encoder == TextEncoderKind::Llama
                           ? text_llama.num_parameters()  // tied: the embedding once
                           : V * C + Lc * C + int64_t{text_layers} * text_block + 2 * C;
  const int64_t frame = (D * C + C) + N * C + (F * C + C) + (C * C + C) + (2 * C * C + 2 * C) +
                        (D * C + D);
  const int64_t Ct = text_width();
  const int64_t text_conditioning = 2 * (Ct * C + C) + (C * C + C);  // context, y embedders
  return frame + text + text_conditioning + L * 2 * stream - (stream - pre_only);
}

double MMDiTConfig::flops_per_token(int T) const {
  const double C = n_embd, L = n_layer, H = ffn_hidden_size, D = patch_dim(), F = frequency_dim;
  const double N = T, Lc = caption_tokens, Ct = text_width();
  const double block = 4.0 * C * C + 2.0 * C * H;  // a stream's matmuls per position
  // The context stream (the last block's pre-only: its qkv) and the context embedder.
  const double per_caption_position = (L - 1) * block + 3.0 * C * C + Ct * C;
  // The timestep MLP, the final layer's adaLN, every block's adaLN (the last context's
  // shift and scale only) and the pooled-text MLP.
  const double per_image = F * C + C * C + 2.0 * C * C + L * 12.0 * C * C - 4.0 * C * C +
                           (Ct * C + C * C);
  const double matmul = 2.0 * D * C + L * block + Lc / N * per_caption_position + per_image / N;
  return 6.0 * matmul + 12.0 * L * (N + Lc) * (N + Lc) * C / N +
         Lc / N * text_flops_per_position();
}

double MMDiTConfig::text_flops_per_position() const {
  const double C = n_embd, H = ffn_hidden_size, Lc = caption_tokens, Lt = text_layers;
  if (text_encoder == TextEncoderKind::Joint)
    return 6.0 * Lt * (4.0 * C * C + 2.0 * C * H) + 12.0 * Lt * Lc * C;
  double weights = 0;
  for (int l = 0; l < text_layers; ++l) weights += text_llama.block_matmul_weights(l);
  const double heads = static_cast<double>(text_llama.n_head) * text_llama.head_dim();
  return 2.0 * weights + 4.0 * Lt * Lc * heads;
}

std::string MMDiTConfig::str() const {
  const std::string text =
      text_encoder == TextEncoderKind::Llama
          ? fmt::format("frozen Llama text encoder ({})", text_llama.str())
          : fmt::format("text.n_layer={}", text_layers);
  return fmt::format("MMDiT n_layer={} n_head={} n_embd={} ffn={} image={}x{}x{} patch={} ({} "
                     "patches) vocab={} caption_tokens={} {} caption_dropout={} params={:.3f}M",
                     n_layer, n_head, n_embd, ffn_hidden_size, image_size, image_size,
                     num_channels, patch_size, patches(), vocab_size, caption_tokens, text,
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
  if (o.choice(keys, "text.encoder") == "llama") {
    c.text_encoder = TextEncoderKind::Llama;
    try {
      c.text_llama = llama_config_of(llama_text_options(o, keys));
    } catch (const Error& e) {
      throw Error(fmt::format("mmdit's Llama text encoder (the [model] text.* keys): {}", e.what()));
    }
  } else {
    // A resolved config holds every key, so only a value other than the default counts.
    for (const auto& [name, value] : o.family)
      KILN_CHECK(!name.starts_with(kText) || shared_text_key(name) ||
                     value == find_model_key(keys, name)->default_value,
                 "model.{} = {} is a Llama text encoder's key: it needs model.text.encoder = "
                 "\"llama\"", name, value);
  }
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
  if (c.text_encoder == TextEncoderKind::Llama) {
    j["text.encoder"] = "llama";
    j["text"] = llama_config_json(c.text_llama);
  }
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
  if (j.contains("text.encoder")) {  // absent: the joint encoder (checkpoints before it)
    KILN_CHECK(j["text.encoder"] == "llama" && j.contains("text"),
               "state.model: \"text.encoder\" must be \"llama\", with its \"text\" object");
    const ModelOptions t = llama_options_from_json(j["text"]);
    o.family["text.encoder"] = 1.0;  // the index of "llama"
    o.family["text.n_head"] = t.n_head;
    o.family["text.n_embd"] = t.n_embd;
    for (const auto& [name, value] : t.family)
      if (name != "tie_embeddings") o.family[std::string(kText) + name] = value;
  }
  mmdit_config_of(o);  // validates
  return o;
}

}  // namespace kiln

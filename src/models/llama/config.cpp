#include "models/llama/config.h"
#include "models/model_options.h"

#include "core/error.h"
#include "core/json_util.h"

#include <fmt/format.h>

namespace kiln {

const ModelKeys& llama_keys() {
  using enum ModelKeyType;
  static const ModelKeys keys{
      {.name = "n_kv_head", .type = Integer, .lo = 0,
       .description = "Key/value heads of grouped-query attention (llama); must divide n_head; "
                      "0 = n_head."},
      {.name = "head_dim", .type = Integer, .lo = 0,
       .description = "Attention head size (llama); need not be n_embd / n_head (Qwen3: 128 "
                      "with n_embd 2048, 32 heads); even (rotary); 0 = n_embd / n_head."},
      {.name = "qk_norm", .type = Bool,
       .description = "Per-head RMSNorm of q and k (gains [head_dim], eps norm_eps) after the "
                      "projection, before rotary (llama; Qwen3's q_norm / k_norm)."},
      {.name = "ffn_hidden_size", .type = Integer, .lo = 0,
       .description = "MLP hidden width (llama: SwiGLU gate/up width); 0 = the architecture's "
                      "default (2/3 of 4 n_embd rounded up to a multiple of 256)."},
      {.name = "norm_eps", .type = Float, .default_value = 1e-5, .lo = 0, .lo_open = true,
       .description = "RMSNorm epsilon (llama)."},
      {.name = "rope_theta", .type = Float, .default_value = 10000.0, .lo = 0, .lo_open = true,
       .description = "Rotary base theta (llama; Llama 3: 500000)."},
      {.name = "rope_scaling.factor", .type = Float, .lo = 0,
       .description = "Llama 3.1 \"llama3\" rope scaling: long wavelengths divided by this; 0 = "
                      "no scaling."},
      {.name = "rope_scaling.low_freq_factor", .type = Float, .default_value = 1.0, .lo = 0,
       .lo_open = true,
       .description = "llama3 rope scaling: wavelengths above original_max_position / "
                      "low_freq_factor are scaled."},
      {.name = "rope_scaling.high_freq_factor", .type = Float, .default_value = 4.0, .lo = 0,
       .lo_open = true,
       .description = "llama3 rope scaling: wavelengths below original_max_position / "
                      "high_freq_factor are kept."},
      {.name = "rope_scaling.original_max_position", .type = Float, .default_value = 8192.0,
       .lo = 0, .lo_open = true,
       .description = "llama3 rope scaling: the pre-training context length (HF "
                      "original_max_position_embeddings)."},
      {.name = "tie_embeddings", .type = Bool,
       .description = "The output head is the token embedding (llama; Llama 3.2 1B/3B tie). "
                      "GPT-2 always ties."},
  };
  return keys;
}

RopeSpec llama_rope_of(const ModelOptions& o) {
  const ModelKeys& k = llama_keys();
  RopeSpec rope;
  rope.theta = o.value(k, "rope_theta");
  rope.scale_factor = o.value(k, "rope_scaling.factor");
  rope.low_freq_factor = o.value(k, "rope_scaling.low_freq_factor");
  rope.high_freq_factor = o.value(k, "rope_scaling.high_freq_factor");
  rope.original_max_positions = o.value(k, "rope_scaling.original_max_position");
  return rope;
}

void llama_check_options(const ModelOptions& o, const KeySource& source) {
  const int n_kv_head = o.integer(llama_keys(), "n_kv_head");
  if (n_kv_head > 0 && o.n_head > 0)
    KILN_CHECK(o.n_head % n_kv_head == 0, "{}: key 'model.n_kv_head' ({}) must divide "
               "model.n_head ({})", source("model.n_kv_head"), n_kv_head, o.n_head);
  const int head_dim = o.integer(llama_keys(), "head_dim");
  KILN_CHECK(head_dim % 2 == 0, "{}: key 'model.head_dim' ({}) must be even: rotary "
             "embeddings turn channel pairs", source("model.head_dim"), head_dim);
  const RopeSpec rope = llama_rope_of(o);
  if (rope.scale_factor > 0)
    KILN_CHECK(rope.high_freq_factor > rope.low_freq_factor,
               "{}: key 'model.rope_scaling.high_freq_factor' ({}) must exceed "
               "model.rope_scaling.low_freq_factor ({})",
               source("model.rope_scaling.high_freq_factor"), rope.high_freq_factor,
               rope.low_freq_factor);
}

int LlamaConfig::default_ffn_hidden_size(int n_embd) {
  const int h = 2 * (4 * n_embd) / 3;
  return (h + 255) / 256 * 256;
}

void LlamaConfig::validate() const {
  KILN_CHECK(n_layer > 0, "model.n_layer must be positive for llama (got {})", n_layer);
  KILN_CHECK(explicit_head_dim >= 0, "model.head_dim must be >= 0 (got {}; 0 = n_embd / "
             "n_head)", explicit_head_dim);
  KILN_CHECK(n_head > 0 && n_embd > 0 && n_embd % n_head == 0,
             "model.n_embd ({}) must be a positive multiple of model.n_head ({})", n_embd, n_head);
  KILN_CHECK(explicit_head_dim % 2 == 0, "model.head_dim ({}) must be even for rotary "
             "embeddings", explicit_head_dim);
  KILN_CHECK(head_dim() % 2 == 0, "model.n_embd / model.n_head ({}) must be even for rotary "
             "embeddings (or set model.head_dim)", head_dim());
  KILN_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0,
             "model.n_kv_head ({}) must divide model.n_head ({})", n_kv_head, n_head);
  KILN_CHECK(ffn_hidden_size > 0, "model.ffn_hidden_size must be positive (got {})", ffn_hidden_size);
  // Widths are ints: the fused q/k/v ((NH + 2 NKV) HD) and gate/up (2 F) must fit one.
  const int64_t qkv_width = (int64_t{n_head} + 2 * n_kv_head) * head_dim();
  KILN_CHECK(qkv_width <= INT32_MAX && ffn_hidden_size <= INT32_MAX / 2,
             "model.head_dim ({}) or model.ffn_hidden_size ({}) is too large: (n_head + 2 "
             "n_kv_head) * head_dim and 2 * ffn_hidden_size must be below 2^31", head_dim(),
             ffn_hidden_size);
  KILN_CHECK(vocab_size > 0 && padded_vocab_size >= vocab_size,
             "model.vocab_size ({}) must be positive and at most the padded {}", vocab_size,
             padded_vocab_size);
  KILN_CHECK(block_size > 0, "model.block_size must be positive (got {})", block_size);
  KILN_CHECK(norm_eps > 0.f, "model.norm_eps must be positive (got {})", norm_eps);
  KILN_CHECK(rope.theta > 0.0, "model.rope_theta must be positive (got {})", rope.theta);
  KILN_CHECK(rope.scale_factor == 0.0 || rope.scale_factor >= 1.0,
             "model.rope_scaling.factor must be 0 (no scaling) or >= 1 (got {}): it stretches "
             "long wavelengths", rope.scale_factor);
  if (rope.scale_factor > 0.0) {
    KILN_CHECK(rope.low_freq_factor > 0.0 && rope.high_freq_factor > rope.low_freq_factor,
               "model.rope_scaling.high_freq_factor ({}) must exceed low_freq_factor ({}) > 0",
               rope.high_freq_factor, rope.low_freq_factor);
    KILN_CHECK(rope.original_max_positions > 0.0,
               "model.rope_scaling.original_max_position must be positive (got {})",
               rope.original_max_positions);
  }
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t C = n_embd, L = n_layer, V = vocab_size, F = ffn_hidden_size;
  const int64_t HD = head_dim(), NH = n_head, NKV = n_kv_head;
  const int64_t block =
      C * (NH + 2 * NKV) * HD + NH * HD * C + 3 * C * F + 2 * C + (qk_norm ? 2 * HD : 0);
  return V * C * (tie_embeddings ? 1 : 2) + L * block + C;
}

double LlamaConfig::flops_per_token(int T) const {
  const double C = n_embd, L = n_layer, V = vocab_size, F = ffn_hidden_size;
  const double HD = head_dim(), NH = n_head, NKV = n_kv_head;
  const double matmul = L * (C * (NH + 2 * NKV) * HD + NH * HD * C + 3 * C * F) + V * C;
  return 6.0 * matmul + 12.0 * L * static_cast<double>(T) * NH * HD;
}

std::string LlamaConfig::str() const {
  return fmt::format("Llama n_layer={} n_head={} n_kv_head={} n_embd={} head_dim={}{} ffn={} "
                     "vocab={} (padded {}) block={} rope_theta={} rope_scaling={} {} "
                     "params={:.2f}M",
                     n_layer, n_head, n_kv_head, n_embd, head_dim(), qk_norm ? " qk_norm" : "",
                     ffn_hidden_size, vocab_size,
                     padded_vocab_size, block_size, rope.theta, rope.scale_factor,
                     tie_embeddings ? "tied" : "untied", num_parameters() / 1e6);
}

LlamaConfig llama_config_of(const ModelOptions& o) {
  KILN_CHECK(o.dropout == 0.f, "model.dropout ({}): llama has no dropout (set 0)", o.dropout);
  check_family_keys(o, llama_keys());
  const ModelKeys& k = llama_keys();
  LlamaConfig c;
  c.n_layer = o.n_layer;
  c.n_head = o.n_head;
  const int n_kv_head = o.integer(k, "n_kv_head"), ffn = o.integer(k, "ffn_hidden_size");
  c.n_kv_head = n_kv_head > 0 ? n_kv_head : o.n_head;
  c.n_embd = o.n_embd;
  c.explicit_head_dim = o.integer(k, "head_dim");
  c.qk_norm = o.flag(k, "qk_norm");
  c.ffn_hidden_size = ffn > 0 ? ffn : LlamaConfig::default_ffn_hidden_size(o.n_embd);
  c.vocab_size = o.vocab_size;
  c.padded_vocab_size = (o.vocab_size + 127) / 128 * 128;
  c.block_size = o.block_size;
  c.norm_eps = static_cast<float>(o.value(k, "norm_eps"));
  c.rope = llama_rope_of(o);
  c.tie_embeddings = o.flag(k, "tie_embeddings");
  c.validate();
  return c;
}

nlohmann::json llama_config_json(const LlamaConfig& c) {
  return {{"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_kv_head", c.n_kv_head},
          {"n_embd", c.n_embd},
          {"head_dim", c.explicit_head_dim},
          {"qk_norm", c.qk_norm},
          {"ffn_hidden_size", c.ffn_hidden_size},
          {"vocab_size", c.vocab_size},
          {"padded_vocab_size", c.padded_vocab_size},
          {"block_size", c.block_size},
          {"norm_eps", c.norm_eps},
          {"rope_theta", c.rope.theta},
          {"rope_scaling",
           {{"factor", c.rope.scale_factor},
            {"low_freq_factor", c.rope.low_freq_factor},
            {"high_freq_factor", c.rope.high_freq_factor},
            {"original_max_position", c.rope.original_max_positions}}},
          {"tie_embeddings", c.tie_embeddings}};
}

ModelOptions llama_options_from_json(const nlohmann::json& j) {
  ModelOptions o;
  o.arch = "llama";
  auto integer = [&](const char* key) {
    return static_cast<int>(json_integer_field(j, key, "state.model", INT32_MIN, INT32_MAX));
  };
  o.n_layer = integer("n_layer");
  o.n_head = integer("n_head");
  o.n_embd = integer("n_embd");
  o.vocab_size = integer("vocab_size");
  o.block_size = integer("block_size");
  o.family["n_kv_head"] = integer("n_kv_head");
  o.family["ffn_hidden_size"] = integer("ffn_hidden_size");
  // Checkpoints from before the keys: the Llama 3 attention (0 = n_embd / n_head, no norm).
  if (j.contains("head_dim")) o.family["head_dim"] = integer("head_dim");
  if (j.contains("qk_norm")) o.family["qk_norm"] = j.at("qk_norm").get<bool>() ? 1.0 : 0.0;
  o.family["norm_eps"] = j.at("norm_eps").get<float>();
  o.family["rope_theta"] = j.at("rope_theta").get<double>();
  const auto& rs = j.at("rope_scaling");
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position"})
    o.family[std::string("rope_scaling.") + key] = rs.at(key).get<double>();
  o.family["tie_embeddings"] = j.at("tie_embeddings").get<bool>() ? 1.0 : 0.0;
  llama_config_of(o);  // validates
  return o;
}

}  // namespace kiln

#include "models/llama/config.h"
#include "models/model_options.h"

#include "core/error.h"
#include "core/json_util.h"

#include <fmt/format.h>

namespace kiln {

int LlamaConfig::default_ffn_hidden_size(int n_embd) {
  const int h = 2 * (4 * n_embd) / 3;
  return (h + 255) / 256 * 256;
}

void LlamaConfig::validate() const {
  KILN_CHECK(n_layer > 0, "model.n_layer must be positive for llama (got {})", n_layer);
  KILN_CHECK(n_head > 0 && n_embd > 0 && n_embd % n_head == 0,
             "model.n_embd ({}) must be a positive multiple of model.n_head ({})", n_embd, n_head);
  KILN_CHECK(head_dim() % 2 == 0, "model.n_embd / model.n_head ({}) must be even for rotary "
             "embeddings", head_dim());
  KILN_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0,
             "model.n_kv_head ({}) must divide model.n_head ({})", n_kv_head, n_head);
  KILN_CHECK(ffn_hidden_size > 0, "model.ffn_hidden_size must be positive (got {})", ffn_hidden_size);
  // Widths are ints: the fused q/k/v (at most 3 n_embd) and gate/up (2 F) must fit one.
  KILN_CHECK(n_embd <= INT32_MAX / 3 && ffn_hidden_size <= INT32_MAX / 2,
             "model.n_embd ({}) or model.ffn_hidden_size ({}) is too large: 3 * n_embd and 2 * "
             "ffn_hidden_size must be below 2^31", n_embd, ffn_hidden_size);
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
  const int64_t block = C * (NH + 2 * NKV) * HD + NH * HD * C + 3 * C * F + 2 * C;
  return V * C * (tie_embeddings ? 1 : 2) + L * block + C;
}

double LlamaConfig::flops_per_token(int T) const {
  const double C = n_embd, L = n_layer, V = vocab_size, F = ffn_hidden_size;
  const double HD = head_dim(), NH = n_head, NKV = n_kv_head;
  const double matmul = L * (C * (NH + 2 * NKV) * HD + NH * HD * C + 3 * C * F) + V * C;
  return 6.0 * matmul + 12.0 * L * static_cast<double>(T) * NH * HD;
}

std::string LlamaConfig::str() const {
  return fmt::format("Llama n_layer={} n_head={} n_kv_head={} n_embd={} ffn={} vocab={} (padded "
                     "{}) block={} rope_theta={} rope_scaling={} {} params={:.2f}M",
                     n_layer, n_head, n_kv_head, n_embd, ffn_hidden_size, vocab_size,
                     padded_vocab_size, block_size, rope.theta, rope.scale_factor,
                     tie_embeddings ? "tied" : "untied", num_parameters() / 1e6);
}

LlamaConfig llama_config_of(const ModelOptions& o) {
  KILN_CHECK(o.dropout == 0.f, "model.dropout ({}): llama has no dropout (set 0)", o.dropout);
  LlamaConfig c;
  c.n_layer = o.n_layer;
  c.n_head = o.n_head;
  c.n_kv_head = o.n_kv_head > 0 ? o.n_kv_head : o.n_head;
  c.n_embd = o.n_embd;
  c.ffn_hidden_size =
      o.ffn_hidden_size > 0 ? o.ffn_hidden_size : LlamaConfig::default_ffn_hidden_size(o.n_embd);
  c.vocab_size = o.vocab_size;
  c.padded_vocab_size = (o.vocab_size + 127) / 128 * 128;
  c.block_size = o.block_size;
  c.norm_eps = o.norm_eps;
  c.rope = o.rope;
  c.tie_embeddings = o.tie_embeddings;
  c.validate();
  return c;
}

nlohmann::json llama_config_json(const LlamaConfig& c) {
  return {{"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_kv_head", c.n_kv_head},
          {"n_embd", c.n_embd},
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
  o.n_kv_head = integer("n_kv_head");
  o.n_embd = integer("n_embd");
  o.ffn_hidden_size = integer("ffn_hidden_size");
  o.vocab_size = integer("vocab_size");
  o.block_size = integer("block_size");
  o.norm_eps = j.at("norm_eps");
  o.rope.theta = j.at("rope_theta");
  const auto& rs = j.at("rope_scaling");
  o.rope.scale_factor = rs.at("factor");
  o.rope.low_freq_factor = rs.at("low_freq_factor");
  o.rope.high_freq_factor = rs.at("high_freq_factor");
  o.rope.original_max_positions = rs.at("original_max_position");
  o.tie_embeddings = j.at("tie_embeddings");
  llama_config_of(o);  // validates
  return o;
}

}  // namespace kiln

#include "models/llama/formats.h"

#include "core/error.h"
#include "models/llama_config.h"
#include "models/llama/moe_formats.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

namespace kiln {

namespace {

// What a config.json of each model_type kiln's llama reads holds: transformers' defaults of
// the fields it may omit (head_dim 0: hidden_size / num_attention_heads), whether
// intermediate_size is the dense MLP's width (model.ffn_hidden_size; Mixtral's is its
// experts': every block is sparse), whether its attention is Qwen3's (QK-norm, the
// sliding-window fields) and whether it is a mixture of experts (moe_formats.h).
struct HfType {
  const char* model_type;
  double rms_norm_eps, rope_theta;
  int head_dim;
  bool dense_width, qwen3, moe;
};
constexpr HfType kHfTypes[] = {
    {"llama", 1e-6, 10000.0, 0, true, false, false},     // LlamaConfig
    {"mixtral", 1e-5, 1e6, 0, false, false, true},       // MixtralConfig
    {"qwen3", 1e-6, 10000.0, 128, true, true, false},    // Qwen3Config
    {"qwen3_moe", 1e-6, 10000.0, 0, true, true, true},   // Qwen3MoeConfig
};

const HfType& hf_type(const std::string& model_type, const std::string& file) {
  for (const HfType& t : kHfTypes)
    if (model_type == t.model_type) return t;
  KILN_FAIL("{}: model_type = '{}': kiln's llama reads {}", file, model_type,
            fmt::join(llama_hf_model_types(), ", "));
}

// The fields every Llama-family config.json shares (head_dim among them): all but the MoE ones.
ModelOptions llama_shape_from_hf(const nlohmann::json& cfg, const std::string& file,
                                 const HfType& defaults) {
  ModelOptions o;
  o.arch = "llama";
  o.n_embd = hf_int(cfg, "hidden_size", file);
  o.n_layer = hf_int(cfg, "num_hidden_layers", file);
  o.n_head = hf_int(cfg, "num_attention_heads", file);
  o.vocab_size = hf_int(cfg, "vocab_size", file);
  o.block_size = hf_int(cfg, "max_position_embeddings", file);
  auto& f = o.family;
  f["n_kv_head"] = hf_int(cfg, "num_key_value_heads", file, o.n_head);
  if (defaults.dense_width) f["ffn_hidden_size"] = hf_int(cfg, "intermediate_size", file);
  // As the fp32 model holds it, written as its shortest decimal (config.toml's value).
  f["norm_eps"] = hf_float_value(
      static_cast<float>(hf_double(cfg, "rms_norm_eps", file, defaults.rms_norm_eps)));
  f["rope_theta"] = hf_double(cfg, "rope_theta", file, defaults.rope_theta);
  f["tie_embeddings"] = hf_bool(cfg, "tie_word_embeddings", file, false) ? 1.0 : 0.0;
  const std::string act = hf_string(cfg, "hidden_act", file, "silu");
  KILN_CHECK(act == "silu", "{}: hidden_act = '{}': kiln's Llama computes silu", file, act);
  for (const char* key : {"attention_bias", "mlp_bias"})
    KILN_CHECK(!hf_bool(cfg, key, file, false), "{}: {} = true: kiln's Llama has no biases", file, key);
  KILN_CHECK(o.n_head > 0, "{}: num_attention_heads = {} must be positive", file, o.n_head);
  // model.head_dim, when it is not hidden_size / num_attention_heads (its default).
  const int head_dim = hf_int(cfg, "head_dim", file, defaults.head_dim);
  if (head_dim != 0 && (o.n_embd % o.n_head != 0 || head_dim != o.n_embd / o.n_head))
    f["head_dim"] = head_dim;
  if (cfg.contains("rope_scaling") && !cfg["rope_scaling"].is_null()) {
    const nlohmann::json& rs = cfg["rope_scaling"];
    KILN_CHECK(rs.is_object(), "{}: rope_scaling must be an object or null", file);
    const std::string where = file + " rope_scaling";
    const std::string type = hf_string(rs, "rope_type", where, hf_string(rs, "type", where, ""));
    KILN_CHECK(type == "llama3", "{}: rope_scaling.rope_type = '{}': expected llama3 (or null)",
               file, type);
    f["rope_scaling.factor"] = hf_double(rs, "factor", where);
    f["rope_scaling.low_freq_factor"] = hf_double(rs, "low_freq_factor", where);
    f["rope_scaling.high_freq_factor"] = hf_double(rs, "high_freq_factor", where);
    f["rope_scaling.original_max_position"] =
        hf_double(rs, "original_max_position_embeddings", where);
  }
  return o;
}

// Qwen3's attention (Qwen3Config, Qwen3MoeConfig): QK-norm, always; a sliding window only
// where none is used (use_sliding_window false, every layer_types entry "full_attention";
// sliding_window and max_window_layers then mean nothing).
void read_qwen3_attention(ModelOptions& o, const nlohmann::json& cfg, const std::string& file) {
  KILN_CHECK(!hf_bool(cfg, "use_sliding_window", file, false),
             "{}: use_sliding_window = true: kiln's attention is causal over the whole sequence",
             file);
  const auto types = cfg.find("layer_types");
  if (types != cfg.end() && !types->is_null()) {
    KILN_CHECK(types->is_array() && static_cast<int>(types->size()) == o.n_layer,
               "{}: \"layer_types\" must be a list of num_hidden_layers = {} entries, got {}", file,
               o.n_layer, types->dump());
    for (size_t l = 0; l < types->size(); ++l)
      KILN_CHECK((*types)[l] == "full_attention", "{}: layer_types[{}] = {}: kiln's attention is "
                 "causal over the whole sequence in every layer (\"full_attention\")", file, l,
                 (*types)[l].dump());
  }
  o.family["qk_norm"] = 1.0;
}

// `llama` (llama_hf_config's fields) made Qwen3Config's config.json: no mlp_bias nor
// pretraining_tp, no sliding window (layer_types as transformers >= 4.53 writes it).
nlohmann::json qwen3_hf_config(nlohmann::json c, const LlamaConfig& config) {
  for (const char* key : {"mlp_bias", "pretraining_tp"}) c.erase(key);
  c["architectures"] = {"Qwen3ForCausalLM"};
  c["model_type"] = "qwen3";
  c["use_sliding_window"] = false;
  c["sliding_window"] = nullptr;
  c["max_window_layers"] = config.n_layer;
  c["layer_types"] =
      std::vector<std::string>(static_cast<size_t>(config.n_layer), "full_attention");
  return c;
}

}  // namespace

std::vector<std::string> llama_hf_model_types() {
  std::vector<std::string> out;
  for (const HfType& t : kHfTypes) out.emplace_back(t.model_type);
  return out;
}

ModelOptions llama_options_from_hf(const nlohmann::json& cfg, const std::string& file) {
  const std::string type = hf_string(cfg, "model_type", file, "llama");
  const HfType& t = hf_type(type, file);
  ModelOptions o = llama_shape_from_hf(cfg, file, t);
  if (t.qwen3) read_qwen3_attention(o, cfg, file);
  if (t.moe) {
    LlamaConfig moe;
    moe.n_layer = o.n_layer;
    read_moe_hf_config(moe, cfg, file, type);
    llama_set_moe_options(o, moe.moe);
  }
  try {
    llama_config_of(o);
  } catch (const Error& e) {
    KILN_FAIL("{}: {}", file, e.what());
  }
  return o;
}

nlohmann::json llama_hf_config(const ModelOptions& options) {
  const LlamaConfig c = llama_config_of(options);
  const LlamaHfKind kind = llama_hf_kind(c);
  nlohmann::json rope_scaling = nullptr;
  if (c.rope.scale_factor > 0.0)
    rope_scaling = {{"rope_type", "llama3"},
                    {"factor", c.rope.scale_factor},
                    {"low_freq_factor", c.rope.low_freq_factor},
                    {"high_freq_factor", c.rope.high_freq_factor},
                    {"original_max_position_embeddings", c.rope.original_max_positions}};
  nlohmann::json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.n_embd},
      {"intermediate_size", c.ffn_hidden_size},
      {"num_hidden_layers", c.n_layer},
      {"num_attention_heads", c.n_head},
      {"num_key_value_heads", c.n_kv_head},
      {"head_dim", c.head_dim()},
      {"max_position_embeddings", c.block_size},
      {"rms_norm_eps", hf_float_value(c.norm_eps)},
      {"rope_theta", c.rope.theta},
      {"rope_scaling", rope_scaling},
      {"tie_word_embeddings", c.tie_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"initializer_range", 0.02},
      {"pretraining_tp", 1},
      {"use_cache", true}};
  if (kind == LlamaHfKind::Llama) return j;
  if (kind == LlamaHfKind::Qwen3) return qwen3_hf_config(std::move(j), c);
  return moe_hf_config(std::move(j), kind, c);
}

HfLayout llama_hf_layout(const ModelOptions& options) {
  return llama_hf_layout_of(llama_config_of(options));
}

HfLayout llama_hf_layout_of(const LlamaConfig& c) {
  const LlamaHfKind kind = llama_hf_kind(c);
  const int64_t C = c.n_embd, V = c.vocab_size, Vp = c.padded_vocab_size, F = c.ffn_hidden_size;
  const int64_t HD = c.head_dim(), NH = c.n_head, NKV = c.n_kv_head;
  const int64_t Fe = c.moe.ffn_hidden_size;
  HfLayout layout;
  auto one = [&](std::string name, Shape shape, int64_t rows) {
    layout.params.push_back({name, shape, {{name, rows, false}}});
  };
  one("model.embed_tokens.weight", Shape{Vp, C}, V);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    one(p + "input_layernorm.weight", Shape{C}, C);
    layout.params.push_back({p + "self_attn.qkv_proj.weight", Shape{(NH + 2 * NKV) * HD, C},
                             {{p + "self_attn.q_proj.weight", NH * HD, false},
                              {p + "self_attn.k_proj.weight", NKV * HD, false},
                              {p + "self_attn.v_proj.weight", NKV * HD, false}}});
    if (c.qk_norm) {
      one(p + "self_attn.q_norm.weight", Shape{HD}, HD);
      one(p + "self_attn.k_norm.weight", Shape{HD}, HD);
    }
    one(p + "self_attn.o_proj.weight", Shape{C, NH * HD}, C);
    one(p + "post_attention_layernorm.weight", Shape{C}, C);
    if (c.is_moe_block(l)) {
      add_moe_hf_params(layout, p, kind, c.moe.num_experts, Fe, C);
      continue;
    }
    layout.params.push_back({p + "mlp.gate_up_proj.weight", Shape{2 * F, C},
                             {{p + "mlp.gate_proj.weight", F, false},
                              {p + "mlp.up_proj.weight", F, false}}});
    one(p + "mlp.down_proj.weight", Shape{C, F}, C);
  }
  one("model.norm.weight", Shape{C}, C);
  if (!c.tie_embeddings) one("lm_head.weight", Shape{Vp, C}, V);
  layout.optional_prefix = "model.";
  const bool tied = c.tie_embeddings;
  layout.ignored = [tied](const std::string& name) {
    return (tied && name == "lm_head.weight") || name.ends_with(".rotary_emb.inv_freq");
  };
  return layout;
}

}  // namespace kiln

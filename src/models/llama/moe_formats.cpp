#include "models/llama/moe_formats.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace kiln {

bool LlamaMoeKeys::moe_block(int l) const {
  return num_experts > 0 && l >= first_k_dense && (l + 1) % sparse_step == 0 &&
         std::find(dense_layers.begin(), dense_layers.end(), l) == dense_layers.end();
}

namespace {

// The [model] keys with fixed choices hold the choice's index (/work/moe-design.md: the
// family map holds doubles); their TOML, JSON and checkpoint form is the string.
constexpr std::array<const char*, 2> kScorings{"softmax", "sigmoid"};
constexpr std::array<const char*, 2> kAuxTypes{"per_layer", "hf"};
constexpr std::array<const char*, 2> kAuxScopes{"micro_batch", "global"};

template <size_t N>
std::string choice_of(const ModelOptions& o, const char* key, const std::array<const char*, N>& choices) {
  auto it = o.family.find(key);
  const double v = it == o.family.end() ? 0.0 : it->second;
  KILN_CHECK(v >= 0 && v < static_cast<double>(N) && v == static_cast<int>(v),
             "model.{} = {}: not the index of one of its choices", key, v);
  return choices[static_cast<size_t>(v)];
}

template <size_t N>
double index_of(const std::string& choice, const char* key, const std::array<const char*, N>& choices) {
  for (size_t i = 0; i < N; ++i)
    if (choice == choices[i]) return static_cast<double>(i);
  KILN_FAIL("model.{} = '{}': expected one of {}", key, choice, fmt::join(choices, ", "));
}

double number(const ModelOptions& o, const char* key, double fallback) {
  auto it = o.family.find(key);
  return it == o.family.end() ? fallback : it->second;
}

}  // namespace

LlamaMoeKeys llama_moe_keys_of(const ModelOptions& o) {
  LlamaMoeKeys k;
  k.head_dim = static_cast<int>(number(o, "head_dim", 0));
  k.qk_norm = number(o, "qk_norm", 0) != 0;
  k.num_experts = static_cast<int>(number(o, "moe.num_experts", 0));
  k.top_k = static_cast<int>(number(o, "moe.top_k", 2));
  k.ffn_hidden_size = static_cast<int>(number(o, "moe.ffn_hidden_size", 0));
  k.shared_experts = static_cast<int>(number(o, "moe.shared_experts", 0));
  k.scoring = choice_of(o, "moe.scoring", kScorings);
  k.norm_topk_prob = number(o, "moe.norm_topk_prob", 1) != 0;
  k.first_k_dense = static_cast<int>(number(o, "moe.first_k_dense", 0));
  k.sparse_step = static_cast<int>(number(o, "moe.sparse_step", 1));
  KILN_CHECK(k.sparse_step >= 1, "model.moe.sparse_step = {} must be positive", k.sparse_step);
  k.aux_loss_coef = number(o, "moe.aux_loss_coef", 0);
  k.aux_loss_type = choice_of(o, "moe.aux_loss_type", kAuxTypes);
  k.aux_loss_scope = choice_of(o, "moe.aux_loss_scope", kAuxScopes);
  k.z_loss_coef = number(o, "moe.z_loss_coef", 0);
  k.bias_update_rate = number(o, "moe.bias_update_rate", 0);
  if (const auto it = o.family_lists.find("moe.dense_layers"); it != o.family_lists.end())
    k.dense_layers = it->second;
  return k;
}

void set_llama_moe_keys(ModelOptions& o, const LlamaMoeKeys& k) {
  const LlamaMoeKeys d;
  auto set = [&](const char* key, double value, double fallback) {
    if (value != fallback) o.family[key] = value;
  };
  set("head_dim", k.head_dim, d.head_dim);
  set("qk_norm", k.qk_norm, d.qk_norm);
  set("moe.num_experts", k.num_experts, d.num_experts);
  set("moe.top_k", k.top_k, d.top_k);
  set("moe.ffn_hidden_size", k.ffn_hidden_size, d.ffn_hidden_size);
  set("moe.shared_experts", k.shared_experts, d.shared_experts);
  set("moe.scoring", index_of(k.scoring, "moe.scoring", kScorings), 0);
  set("moe.norm_topk_prob", k.norm_topk_prob, d.norm_topk_prob);
  set("moe.first_k_dense", k.first_k_dense, d.first_k_dense);
  set("moe.sparse_step", k.sparse_step, d.sparse_step);
  set("moe.aux_loss_coef", k.aux_loss_coef, d.aux_loss_coef);
  set("moe.aux_loss_type", index_of(k.aux_loss_type, "moe.aux_loss_type", kAuxTypes), 0);
  set("moe.aux_loss_scope", index_of(k.aux_loss_scope, "moe.aux_loss_scope", kAuxScopes), 0);
  set("moe.z_loss_coef", k.z_loss_coef, d.z_loss_coef);
  set("moe.bias_update_rate", k.bias_update_rate, d.bias_update_rate);
  if (!k.dense_layers.empty()) o.family_lists["moe.dense_layers"] = k.dense_layers;
}

namespace {

// The experts' shape and routing every MoE config.json gives: the expert count under
// `experts_key`, num_experts_per_tok, the width under `width_key`, router_aux_loss_coef.
void read_experts(LlamaMoeKeys& k, const nlohmann::json& cfg, const std::string& file,
                  const char* experts_key, const char* width_key) {
  k.num_experts = hf_int(cfg, experts_key, file);
  k.top_k = hf_int(cfg, "num_experts_per_tok", file);
  k.ffn_hidden_size = hf_int(cfg, width_key, file);
  KILN_CHECK(k.num_experts >= 1, "{}: {} = {}: a MoE model has at least one expert", file,
             experts_key, k.num_experts);
  KILN_CHECK(k.top_k >= 1 && k.top_k <= k.num_experts,
             "{}: num_experts_per_tok = {} must be between 1 and {} = {}", file, k.top_k,
             experts_key, k.num_experts);
  KILN_CHECK(k.ffn_hidden_size >= 1, "{}: {} = {} must be positive", file, width_key,
             k.ffn_hidden_size);
  k.aux_loss_coef = hf_double(cfg, "router_aux_loss_coef", file, 0.001);
  k.aux_loss_type = "hf";  // transformers' load_balancing_loss_func
}

LlamaMoeKeys mixtral_keys(const nlohmann::json& cfg, const std::string& file) {
  LlamaMoeKeys k;
  read_experts(k, cfg, file, "num_local_experts", "intermediate_size");
  const auto window = cfg.find("sliding_window");
  KILN_CHECK(window == cfg.end() || window->is_null(),
             "{}: sliding_window = {}: kiln's attention is causal over the whole sequence (set "
             "null)", file, window == cfg.end() ? "" : window->dump());
  const double jitter = hf_double(cfg, "router_jitter_noise", file, 0.0);
  KILN_CHECK(jitter == 0.0, "{}: router_jitter_noise = {}: kiln's router adds no noise (set 0)",
             file, jitter);
  return k;
}

LlamaMoeKeys qwen3_moe_keys(const nlohmann::json& cfg, const std::string& file, int n_layer) {
  LlamaMoeKeys k;
  read_experts(k, cfg, file, "num_experts", "moe_intermediate_size");
  k.qk_norm = true;
  k.norm_topk_prob = hf_bool(cfg, "norm_topk_prob", file, false);
  k.sparse_step = hf_int(cfg, "decoder_sparse_step", file, 1);
  KILN_CHECK(k.sparse_step >= 1, "{}: decoder_sparse_step = {} must be positive", file, k.sparse_step);
  const auto dense = cfg.find("mlp_only_layers");
  if (dense != cfg.end() && !dense->is_null()) {
    KILN_CHECK(dense->is_array(), "{}: \"mlp_only_layers\" must be a list of layer indices, got {}",
               file, dense->dump());
    for (const auto& l : *dense) {
      KILN_CHECK(l.is_number_integer() && l.get<int64_t>() >= 0 && l.get<int64_t>() < n_layer,
                 "{}: mlp_only_layers holds {}: not a layer index 0..{}", file, l.dump(), n_layer - 1);
      k.dense_layers.push_back(l.get<int>());
    }
  }
  KILN_CHECK(!hf_bool(cfg, "use_sliding_window", file, false),
             "{}: use_sliding_window = true: kiln's attention is causal over the whole sequence",
             file);
  return k;
}

}  // namespace

LlamaMoeKeys llama_moe_keys_from_hf(const nlohmann::json& cfg, const std::string& file,
                                    const std::string& type, int n_layer) {
  LlamaMoeKeys k;
  if (type == "mixtral")
    k = mixtral_keys(cfg, file);
  else if (type == "qwen3_moe")
    k = qwen3_moe_keys(cfg, file, n_layer);
  else
    KILN_FAIL("{}: model_type = '{}': not a mixture-of-experts layout (mixtral, qwen3_moe)", file, type);
  const int hidden = hf_int(cfg, "hidden_size", file), heads = hf_int(cfg, "num_attention_heads", file);
  KILN_CHECK(heads > 0, "{}: num_attention_heads = {} must be positive", file, heads);
  k.head_dim = hf_int(cfg, "head_dim", file, hidden / heads);
  if (k.head_dim == hidden / heads && hidden % heads == 0) k.head_dim = 0;  // the default
  return k;
}

namespace {

// The [model] key that makes block l dense.
const char* dense_reason(const LlamaMoeKeys& k, int l) {
  if (l < k.first_k_dense) return "moe.first_k_dense";
  if ((l + 1) % k.sparse_step != 0) return "moe.sparse_step";
  return "moe.dense_layers";
}

}  // namespace

LlamaHfKind llama_hf_kind(const LlamaMoeKeys& k, int n_layer) {
  if (k.num_experts == 0) {
    KILN_CHECK(!k.qk_norm, "model.qk_norm = true: a dense Llama's config.json has no "
               "q_norm / k_norm (only Qwen3-MoE, a MoE model, has them in kiln's folders)");
    return LlamaHfKind::Llama;
  }
  const char* layouts = "neither Mixtral nor Qwen3-MoE folders";
  KILN_CHECK(k.shared_experts == 0, "model.moe.shared_experts = {}: {} hold shared experts",
             k.shared_experts, layouts);
  KILN_CHECK(k.scoring == "softmax", "model.moe.scoring = '{}': {} score experts but by softmax",
             k.scoring, layouts);
  KILN_CHECK(k.bias_update_rate == 0.0, "model.moe.bias_update_rate = {}: {} hold the "
             "balancing bias", k.bias_update_rate, layouts);
  if (k.qk_norm) return LlamaHfKind::Qwen3Moe;
  KILN_CHECK(k.norm_topk_prob, "model.moe.norm_topk_prob = false: Mixtral always renormalises "
             "the chosen experts' weights (and a model without QK-norm is written as Mixtral)");
  for (int l = 0; l < n_layer; ++l)
    KILN_CHECK(k.moe_block(l), "model.{}: block {} is dense, but every Mixtral block is MoE (and "
               "a model without QK-norm is written as Mixtral)", dense_reason(k, l), l);
  return LlamaHfKind::Mixtral;
}

namespace {

// Qwen3-MoE's mlp_only_layers: moe.dense_layers as given, then the blocks below
// moe.first_k_dense it lacks.
nlohmann::json mlp_only_layers(const LlamaMoeKeys& k) {
  std::vector<int> out = k.dense_layers;
  for (int l = 0; l < k.first_k_dense; ++l)
    if (std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
  return out;
}

}  // namespace

nlohmann::json moe_hf_config(nlohmann::json c, LlamaHfKind kind, const LlamaMoeKeys& k,
                             int ffn_hidden_size) {
  if (kind == LlamaHfKind::Llama) return c;
  const int F = k.ffn_hidden_size > 0 ? k.ffn_hidden_size : ffn_hidden_size;
  for (const char* key : {"mlp_bias", "pretraining_tp"}) c.erase(key);
  if (k.head_dim > 0) c["head_dim"] = k.head_dim;
  c["num_experts_per_tok"] = k.top_k;
  c["router_aux_loss_coef"] = k.aux_loss_coef;
  c["output_router_logits"] = false;
  c["sliding_window"] = nullptr;
  if (kind == LlamaHfKind::Mixtral) {
    c.erase("attention_bias");
    c["architectures"] = {"MixtralForCausalLM"};
    c["model_type"] = "mixtral";
    c["intermediate_size"] = F;
    c["num_local_experts"] = k.num_experts;
    c["router_jitter_noise"] = 0.0;
    return c;
  }
  c["architectures"] = {"Qwen3MoeForCausalLM"};
  c["model_type"] = "qwen3_moe";
  c["intermediate_size"] = ffn_hidden_size;
  c["moe_intermediate_size"] = F;
  c["num_experts"] = k.num_experts;
  c["norm_topk_prob"] = k.norm_topk_prob;
  c["decoder_sparse_step"] = k.sparse_step;
  c["mlp_only_layers"] = mlp_only_layers(k);
  c["use_sliding_window"] = false;
  return c;
}

void add_moe_hf_params(HfLayout& layout, const std::string& p, LlamaHfKind kind, int64_t E,
                       int64_t F, int64_t C) {
  KILN_CHECK(kind != LlamaHfKind::Llama, "add_moe_hf_params: a dense Llama has no experts");
  const bool mixtral = kind == LlamaHfKind::Mixtral;
  const std::string hf = p + (mixtral ? "block_sparse_moe." : "mlp.");
  layout.params.push_back({p + "mlp.router.weight", Shape{E, C}, {{hf + "gate.weight", E, false}}});
  HfParam gate_up{p + "mlp.experts.gate_up_proj.weight", Shape{E, 2 * F, C}, {}};
  HfParam down{p + "mlp.experts.down_proj.weight", Shape{E, C, F}, {}};
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = fmt::format("{}experts.{}.", hf, e);
    gate_up.pieces.push_back({x + (mixtral ? "w1.weight" : "gate_proj.weight"), F, false});
    gate_up.pieces.push_back({x + (mixtral ? "w3.weight" : "up_proj.weight"), F, false});
    down.pieces.push_back({x + (mixtral ? "w2.weight" : "down_proj.weight"), C, false});
  }
  layout.params.push_back(std::move(gate_up));
  layout.params.push_back(std::move(down));
}

}  // namespace kiln

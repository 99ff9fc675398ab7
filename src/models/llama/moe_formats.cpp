#include "models/llama/moe_formats.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln {

namespace {

// The experts' shape and routing every MoE config.json gives: the expert count under
// `experts_key`, num_experts_per_tok, the width under `width_key`, router_aux_loss_coef.
void read_experts(LlamaMoeConfig& k, const nlohmann::json& cfg, const std::string& file,
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

LlamaMoeConfig mixtral_moe(const nlohmann::json& cfg, const std::string& file) {
  LlamaMoeConfig k;
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

LlamaMoeConfig qwen3_moe(const nlohmann::json& cfg, const std::string& file, int n_layer) {
  LlamaMoeConfig k;
  read_experts(k, cfg, file, "num_experts", "moe_intermediate_size");
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
  return k;
}

}  // namespace

void read_moe_hf_config(LlamaConfig& c, const nlohmann::json& cfg, const std::string& file,
                        const std::string& type) {
  if (type == "mixtral") {
    c.moe = mixtral_moe(cfg, file);
  } else if (type == "qwen3_moe") {
    c.moe = qwen3_moe(cfg, file, c.n_layer);
  } else {
    KILN_FAIL("{}: model_type = '{}': not a mixture-of-experts layout (mixtral, qwen3_moe)", file,
              type);
  }
}

namespace {

// The [model] key that makes block l dense.
const char* dense_reason(const LlamaMoeConfig& k, int l) {
  if (l < k.first_k_dense) return "moe.first_k_dense";
  if ((l + 1) % k.sparse_step != 0) return "moe.sparse_step";
  return "moe.dense_layers";
}

}  // namespace

LlamaHfKind llama_hf_kind(const LlamaConfig& c) {
  const LlamaMoeConfig& k = c.moe;
  if (k.num_experts == 0) return c.qk_norm ? LlamaHfKind::Qwen3 : LlamaHfKind::Llama;
  const char* layouts = "neither Mixtral nor Qwen3-MoE folders";
  KILN_CHECK(k.shared_experts == 0, "model.moe.shared_experts = {}: {} hold shared experts",
             k.shared_experts, layouts);
  KILN_CHECK(k.scoring == "softmax", "model.moe.scoring = '{}': {} score experts but by softmax",
             k.scoring, layouts);
  KILN_CHECK(!k.expert_bias, "model.moe.expert_bias = true: {} hold an expert "
             "selection bias", layouts);
  KILN_CHECK(k.routing == "top_k", "model.moe.routing = '{}': {} route by the top-k scores",
             k.routing, layouts);
  if (c.qk_norm) return LlamaHfKind::Qwen3Moe;
  KILN_CHECK(k.norm_topk_prob, "model.moe.norm_topk_prob = false: Mixtral always renormalises "
             "the chosen experts' weights (and a model without QK-norm is written as Mixtral)");
  for (int l = 0; l < c.n_layer; ++l)
    KILN_CHECK(c.is_moe_block(l), "model.{}: block {} is dense, but every Mixtral block is MoE (and "
               "a model without QK-norm is written as Mixtral)", dense_reason(k, l), l);
  return LlamaHfKind::Mixtral;
}

namespace {

// Qwen3-MoE's mlp_only_layers: moe.dense_layers as given, then the blocks below
// moe.first_k_dense it lacks.
nlohmann::json mlp_only_layers(const LlamaMoeConfig& k) {
  std::vector<int> out = k.dense_layers;
  for (int l = 0; l < k.first_k_dense; ++l)
    if (std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
  return out;
}

}  // namespace

nlohmann::json moe_hf_config(nlohmann::json c, LlamaHfKind kind, const LlamaConfig& config) {
  KILN_CHECK(kind == LlamaHfKind::Mixtral || kind == LlamaHfKind::Qwen3Moe,
             "moe_hf_config: a dense model's config.json has no experts");
  const LlamaMoeConfig& k = config.moe;
  const int F = k.ffn_hidden_size, ffn_hidden_size = config.ffn_hidden_size;
  for (const char* key : {"mlp_bias", "pretraining_tp"}) c.erase(key);
  c["head_dim"] = config.head_dim();
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
  KILN_CHECK(kind == LlamaHfKind::Mixtral || kind == LlamaHfKind::Qwen3Moe,
             "add_moe_hf_params: a dense model has no experts");
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

// Llama 3's registry entry (models/registry.h): its factory, what it supports, its presets
// (Meta's published 3.1 and 3.2 sizes) and its Hugging Face folders (Llama, Mixtral and
// Qwen3-MoE).
#include "models/llama/arch.h"

#include "models/llama/formats.h"
#include "models/llama/llama.h"

#include <fmt/format.h>

namespace kiln {

namespace {

// The family keys of Meta's published Llama 3 configs: rope_theta 500000, "llama3" rope
// scaling (low/high frequency factors 1 and 4 around 8192 positions).
std::map<std::string, double, std::less<>> llama3_keys(int n_kv_head, int ffn_hidden_size,
                                                       double rope_factor, bool tied) {
  return {{"n_kv_head", n_kv_head},
          {"ffn_hidden_size", ffn_hidden_size},
          {"norm_eps", 1e-5},
          {"rope_theta", 500000},
          {"rope_scaling.factor", rope_factor},
          {"rope_scaling.low_freq_factor", 1},
          {"rope_scaling.high_freq_factor", 4},
          {"rope_scaling.original_max_position", 8192},
          {"tie_embeddings", tied ? 1 : 0}};
}

}  // namespace

ModelArch llama_arch() {
  ModelArch a;
  a.make = [](const ModelOptions& o, Backend& backend, const ModelStorage& storage) {
    return std::make_unique<Llama>(llama_config_of(o), backend, storage);
  };
  a.decodes = true;
  a.stages = true;
  a.tensor_parallel = true;
  a.context_parallel = true;
  a.single_layout_reason = [](const ModelOptions& o, std::string_view axis) -> std::string {
    const ModelKeys& k = llama_keys();
    if (o.integer(k, "moe.num_experts") == 0) return "";
    // Each cp rank would apply the capacity to its share of the micro-batch's tokens.
    if (axis == "cp" && o.value(k, "moe.capacity_factor") > 0.0)
      return "a llama that drops tokens past an expert's capacity "
             "(model.moe.capacity_factor > 0)";
    // The hf form's gradient needs its totals over every MoE layer before any backward.
    if (axis == "pp" && o.choice(k, "moe.aux_loss_type") == "hf" &&
        o.value(k, "moe.aux_loss_coef") != 0.0)
      return "a llama whose auxiliary loss couples every mixture-of-experts layer "
             "(model.moe.aux_loss_type = \"hf\", model.moe.aux_loss_coef > 0)";
    return "";
  };
  a.tp_split_reason = [](const ModelOptions& o, int tp) -> std::string {
    const ModelKeys& k = llama_keys();
    if (o.integer(k, "moe.num_experts") == 0) return "";
    // The expert width as the model resolves it: 0 takes the dense width (0: its default).
    int F = o.integer(k, "moe.ffn_hidden_size");
    if (F == 0) F = o.integer(k, "ffn_hidden_size");
    if (F == 0) F = LlamaConfig::default_ffn_hidden_size(o.n_embd);
    if (F % tp == 0) return "";
    return fmt::format("model.moe.ffn_hidden_size = {} does not divide over the {} ranks (each "
                       "expert's hidden units are split as the dense MLP's)", F, tp);
  };
  a.num_experts = [](const ModelOptions& o) { return o.integer(llama_keys(), "moe.num_experts"); };
  a.keys = llama_keys();
  a.check_options = llama_check_options;
  // Meta's published configs (Hugging Face meta-llama/Llama-3.x config.json): 128K
  // context, rope_theta 500000, "llama3" rope scaling (factor 32 for 3.2, 8 for 3.1).
  a.presets = {
      {.name = "llama3.2-1b", .n_layer = 16, .n_head = 32, .n_embd = 2048, .block_size = 131072,
       .vocab_size = 128256, .arch = "llama", .keys = llama3_keys(8, 8192, 32, true)},
      {.name = "llama3.2-3b", .n_layer = 28, .n_head = 24, .n_embd = 3072, .block_size = 131072,
       .vocab_size = 128256, .arch = "llama", .keys = llama3_keys(8, 8192, 32, true)},
      {.name = "llama3.1-8b", .n_layer = 32, .n_head = 32, .n_embd = 4096, .block_size = 131072,
       .vocab_size = 128256, .arch = "llama", .keys = llama3_keys(8, 14336, 8, false)},
      {.name = "llama3.1-70b", .n_layer = 80, .n_head = 64, .n_embd = 8192, .block_size = 131072,
       .vocab_size = 128256, .arch = "llama", .keys = llama3_keys(8, 28672, 8, false)},
  };
  a.options_from_json = llama_options_from_json;
  a.options_from_hf = llama_options_from_hf;
  a.hf_model_types = llama_hf_model_types();
  a.hf_config = llama_hf_config;
  a.hf_layout = llama_hf_layout;
  return a;
}

}  // namespace kiln

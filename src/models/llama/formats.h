// Llama in Hugging Face model folders (models/hf_formats.h): transformers' LlamaConfig as
// config.json, LlamaForCausalLM's tensor names; and dense Qwen3 (Qwen3Config,
// Qwen3ForCausalLM): Llama's names and fields with QK-norm (self_attn.q_norm.weight,
// k_norm.weight [head_dim]: model.qk_norm), head_dim 128 when absent, no sliding window.
// The mixture-of-experts layouts (Mixtral, Qwen3-MoE) are moe_formats.h's.
//
// kiln's fused matrices are Hugging Face's stacked by rows: self_attn.qkv_proj = q_proj,
// k_proj, v_proj and mlp.gate_up_proj = gate_proj, up_proj. Both use the rotate-half rotary
// layout (q and k rows as transformers keeps them, no permutation: the golden reference,
// tests/golden/make_llama_golden.py, computes with HF's names and layout). The embedding
// and lm_head hold the real vocabulary (vocab_size rows) in the folder, kiln's padded
// rows in memory.
#pragma once

#include "models/llama_config.h"
#include "models/llama/moe_formats.h"
#include "models/registry.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kiln {

/// The [model] options of a LlamaConfig config.json (`file` names it in errors):
/// hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default: the
/// heads), intermediate_size, vocab_size, max_position_embeddings, rms_norm_eps (default
/// 1e-6 as LlamaConfig), rope_theta (10000), rope_scaling (null or rope_type "llama3"),
/// tie_word_embeddings (false), head_dim (default hidden_size / num_attention_heads; any
/// other value is model.head_dim). Throws kiln::Error naming the file and key for anything
/// kiln's Llama does not compute: hidden_act other than silu, attention_bias or mlp_bias
/// true, another rope_type, an odd head_dim. model_type "qwen3", "mixtral" and "qwen3_moe"
/// read the same fields (their configs' defaults: Qwen3's head_dim 128, Mixtral's
/// rms_norm_eps 1e-5 and rope_theta 1e6), the MoE ones (read_moe_hf_config), and for
/// "qwen3" and "qwen3_moe" model.qk_norm = true; a use_sliding_window true or a layer_types
/// entry other than "full_attention" is an error naming the file and key. Another
/// model_type is an error naming it.
ModelOptions llama_options_from_hf(const nlohmann::json& cfg, const std::string& file);
/// The config.json model_types llama_options_from_hf reads (ModelArch::hf_model_types):
/// llama, mixtral, qwen3, qwen3_moe.
std::vector<std::string> llama_hf_model_types();
/// The config.json of a Llama of `options` (architectures LlamaForCausalLM, every field
/// transformers' LlamaConfig defines for it; docs/formats.md lists them), of a dense model
/// with model.qk_norm as Qwen3 (Qwen3ForCausalLM: Qwen3Config's fields, no sliding window),
/// or of a MoE model as Mixtral or Qwen3-MoE (llama_hf_kind, moe_hf_config). Throws
/// kiln::Error naming the key for a MoE model neither MoE layout holds.
nlohmann::json llama_hf_config(const ModelOptions& options);
/// Where a Llama's parameters live in a folder (names above, optional "model." prefix, a
/// tied lm_head.weight and rotary_emb.inv_freq buffers ignored; a MoE model's in
/// moe_formats.h's names).
HfLayout llama_hf_layout(const ModelOptions& options);
/// The same for the model of `config` (its MoE blocks and QK-norm included). Throws
/// kiln::Error naming the key that neither Mixtral nor Qwen3-MoE holds (llama_hf_kind).
HfLayout llama_hf_layout_of(const LlamaConfig& config);

}  // namespace kiln

// Llama in Hugging Face model folders (models/hf_formats.h): transformers' LlamaConfig as
// config.json, LlamaForCausalLM's tensor names.
//
// kiln's fused matrices are Hugging Face's stacked by rows: self_attn.qkv_proj = q_proj,
// k_proj, v_proj and mlp.gate_up_proj = gate_proj, up_proj. Both use the rotate-half rotary
// layout (q and k rows as transformers keeps them, no permutation: the golden reference,
// tests/golden/make_llama_golden.py, computes with HF's names and layout). The embedding
// and lm_head hold the real vocabulary (vocab_size rows) in the folder, kiln's padded
// rows in memory.
#pragma once

#include "models/registry.h"

#include <nlohmann/json.hpp>

#include <string>

namespace kiln {

/// The [model] options of a LlamaConfig config.json (`file` names it in errors):
/// hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default: the
/// heads), intermediate_size, vocab_size, max_position_embeddings, rms_norm_eps (default
/// 1e-6 as LlamaConfig), rope_theta (10000), rope_scaling (null or rope_type "llama3"),
/// tie_word_embeddings (false), head_dim (default hidden_size / num_attention_heads; any
/// other value is model.head_dim). Throws kiln::Error naming the file and key for anything
/// kiln's Llama does not compute: hidden_act other than silu, attention_bias or mlp_bias
/// true, another rope_type, an odd head_dim.
ModelOptions llama_options_from_hf(const nlohmann::json& cfg, const std::string& file);
/// The config.json of a Llama of `options` (architectures LlamaForCausalLM, every field
/// transformers' LlamaConfig defines for it; docs/formats.md lists them). Throws
/// kiln::Error for model.qk_norm (LlamaForCausalLM has none).
nlohmann::json llama_hf_config(const ModelOptions& options);
/// Where a Llama's parameters live in a folder (names above, optional "model." prefix, a
/// tied lm_head.weight and rotary_emb.inv_freq buffers ignored).
HfLayout llama_hf_layout(const ModelOptions& options);

}  // namespace kiln

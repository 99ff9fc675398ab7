// Llama-family mixture-of-experts models in Hugging Face folders (models/hf_formats.h):
// transformers' Mixtral (MixtralForCausalLM, model_type "mixtral") and Qwen3-MoE
// (Qwen3MoeForCausalLM, "qwen3_moe"), read into and written from the llama [model] keys of
// issue 38 (head_dim, qk_norm, moe.*; /work/moe-design.md, docs/config.md). The dense
// fields both share with Llama (hidden_size, heads, rope, norms), and Qwen3-MoE's attention
// fields, the same as dense Qwen3's, are models/llama/formats.h's.
//
// Names: a MoE block's router mlp.router.weight [E, C] is Mixtral's
// block_sparse_moe.gate.weight or Qwen3-MoE's mlp.gate.weight; its experts, stacked, are
// mlp.experts.gate_up_proj.weight [E, 2F, C] (expert e's rows [0, F) its w1 / gate_proj,
// [F, 2F) its w3 / up_proj) and mlp.experts.down_proj.weight [E, C, F] (its w2 /
// down_proj). Qwen3-MoE's dense blocks (mlp_only_layers, decoder_sparse_step) are Llama's
// MLP, and its attention has per-head q_norm / k_norm gains [head_dim].
#pragma once

#include "models/hf_formats.h"
#include "models/llama_config.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kiln {

/// The Hugging Face layout of a Llama-family model: dense Llama or Qwen3 (formats.h),
/// Mixtral or Qwen3-MoE.
enum class LlamaHfKind { Llama, Qwen3, Mixtral, Qwen3Moe };

/// The MoE shape a config.json of model_type `type` ("mixtral" or "qwen3_moe") gives, into
/// config.moe (config.n_layer: the model's blocks; head_dim is a shared Llama field and
/// Qwen3-MoE's attention, QK-norm and no sliding window, Qwen3's: formats.h; `file` names
/// the folder's config.json in errors).
/// Mixtral: num_local_experts, num_experts_per_tok, intermediate_size (the experts' width;
/// every block MoE), router_aux_loss_coef (0.001 when absent, as MixtralConfig) with
/// aux_loss_type "hf", renormalised softmax; a non-null sliding_window or
/// router_jitter_noise != 0 is an error. Qwen3-MoE: num_experts, num_experts_per_tok,
/// moe_intermediate_size, decoder_sparse_step (1), mlp_only_layers ([]; moe.dense_layers
/// as listed), norm_topk_prob (false), router_aux_loss_coef (0.001). Throws kiln::Error
/// naming the file and key.
void read_moe_hf_config(LlamaConfig& config, const nlohmann::json& cfg, const std::string& file,
                        const std::string& type);

/// The layout `config` is written in: dense without QK-norm Llama, dense with QK-norm
/// Qwen3, MoE with QK-norm Qwen3-MoE, MoE without Mixtral. Throws kiln::Error naming the
/// [model] key that neither MoE layout can hold: shared experts, sigmoid scoring, the
/// balancing bias; for Mixtral renormalisation off or a dense block.
LlamaHfKind llama_hf_kind(const LlamaConfig& config);

/// `llama` (llama_hf_config's fields of the same model) made the config.json of `kind`
/// (Mixtral or Qwen3Moe, else a kiln::Error): MixtralConfig's or Qwen3MoeConfig's fields
/// (docs/formats.md). config.moe.ffn_hidden_size
/// is the experts' width, config.ffn_hidden_size the dense blocks'.
nlohmann::json moe_hf_config(nlohmann::json llama, LlamaHfKind kind, const LlamaConfig& config);

/// Appends the MLP parameters of MoE block `prefix` ("model.layers.3.") of E experts of
/// width F over C channels, in `kind`'s names (Mixtral or Qwen3Moe).
void add_moe_hf_params(HfLayout& layout, const std::string& prefix, LlamaHfKind kind, int64_t E,
                       int64_t F, int64_t C);

}  // namespace kiln

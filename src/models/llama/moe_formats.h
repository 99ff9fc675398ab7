// Llama-family mixture-of-experts models in Hugging Face folders (models/hf_formats.h):
// transformers' Mixtral (MixtralForCausalLM, model_type "mixtral") and Qwen3-MoE
// (Qwen3MoeForCausalLM, "qwen3_moe"), read into and written from the llama [model] keys of
// issue 38 (head_dim, qk_norm, moe.*; /work/moe-design.md, docs/config.md). The dense
// fields both share with Llama (hidden_size, heads, rope, norms) are models/llama/formats.h's.
//
// Names: a MoE block's router mlp.router.weight [E, C] is Mixtral's
// block_sparse_moe.gate.weight or Qwen3-MoE's mlp.gate.weight; its experts, stacked, are
// mlp.experts.gate_up_proj.weight [E, 2F, C] (expert e's rows [0, F) its w1 / gate_proj,
// [F, 2F) its w3 / up_proj) and mlp.experts.down_proj.weight [E, C, F] (its w2 /
// down_proj). Qwen3-MoE's dense blocks (mlp_only_layers, decoder_sparse_step) are Llama's
// MLP, and its attention has per-head q_norm / k_norm gains [head_dim].
#pragma once

#include "models/hf_formats.h"
#include "models/model_options.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kiln {

/// The Hugging Face layout of a Llama-family model: dense Llama, Mixtral or Qwen3-MoE.
enum class LlamaHfKind { Llama, Mixtral, Qwen3Moe };

/// The [model] keys of issue 38 that the MoE layouts read and write, as values (defaults
/// as the keys declare them: a dense model without QK-norm). Widths resolved: head_dim 0 is
/// n_embd / n_head, moe_ffn_hidden_size 0 the dense ffn_hidden_size.
struct LlamaMoeKeys {
  int head_dim = 0;                 // head_dim
  bool qk_norm = false;             // qk_norm
  int num_experts = 0;              // moe.num_experts; 0: dense
  int top_k = 2;                    // moe.top_k
  int ffn_hidden_size = 0;          // moe.ffn_hidden_size (F_e)
  int shared_experts = 0;           // moe.shared_experts
  std::string scoring = "softmax";  // moe.scoring: softmax | sigmoid
  bool norm_topk_prob = true;       // moe.norm_topk_prob
  int first_k_dense = 0;            // moe.first_k_dense
  int sparse_step = 1;              // moe.sparse_step
  std::vector<int> dense_layers;    // moe.dense_layers
  double aux_loss_coef = 0.0;       // moe.aux_loss_coef
  std::string aux_loss_type = "per_layer";     // moe.aux_loss_type: per_layer | hf
  std::string aux_loss_scope = "micro_batch";  // moe.aux_loss_scope: micro_batch | global
  double z_loss_coef = 0.0;         // moe.z_loss_coef
  double bias_update_rate = 0.0;    // moe.bias_update_rate

  /// Block l is MoE: num_experts > 0, l >= first_k_dense, (l + 1) % sparse_step == 0 and l
  /// not in dense_layers.
  bool moe_block(int l) const;
  bool operator==(const LlamaMoeKeys&) const = default;
};

/// The keys of `options` (each absent one at its default).
LlamaMoeKeys llama_moe_keys_of(const ModelOptions& options);
/// Writes `keys` into options.family, each that differs from its default.
void set_llama_moe_keys(ModelOptions& options, const LlamaMoeKeys& keys);

/// The keys a config.json of model_type `type` ("mixtral" or "qwen3_moe") gives, for a
/// model of `n_layer` blocks (`file` names it in errors). Mixtral: num_local_experts,
/// num_experts_per_tok, intermediate_size (the experts' width; every block MoE),
/// router_aux_loss_coef (0.001 when absent, as MixtralConfig) with aux_loss_type "hf",
/// renormalised softmax; a non-null sliding_window or router_jitter_noise != 0 is an
/// error. Qwen3-MoE: num_experts, num_experts_per_tok, moe_intermediate_size,
/// decoder_sparse_step (1), mlp_only_layers ([]), norm_topk_prob (false),
/// router_aux_loss_coef (0.001), head_dim (hidden_size / num_attention_heads), QK-norm;
/// use_sliding_window true is an error. Throws kiln::Error naming the file and key.
LlamaMoeKeys llama_moe_keys_from_hf(const nlohmann::json& cfg, const std::string& file,
                                    const std::string& type, int n_layer);

/// The layout a model of `keys` with `n_layer` blocks is written in: dense without QK-norm
/// Llama, MoE with QK-norm Qwen3-MoE, MoE without Mixtral. Throws kiln::Error naming the
/// [model] key that neither can hold: QK-norm on a dense model, shared experts, sigmoid
/// scoring, the balancing bias; for Mixtral renormalisation off or a dense block.
LlamaHfKind llama_hf_kind(const LlamaMoeKeys& keys, int n_layer);

/// `llama` (llama_hf_config's fields of the same model) made the config.json of `kind`:
/// MixtralConfig's or Qwen3MoeConfig's fields (docs/formats.md); `ffn_hidden_size` is the
/// dense blocks' width.
nlohmann::json moe_hf_config(nlohmann::json llama, LlamaHfKind kind, const LlamaMoeKeys& keys,
                             int ffn_hidden_size);

/// Appends the MLP parameters of MoE block `prefix` ("model.layers.3.") of E experts of
/// width F over C channels, in `kind`'s names (Mixtral or Qwen3Moe).
void add_moe_hf_params(HfLayout& layout, const std::string& prefix, LlamaHfKind kind, int64_t E,
                       int64_t F, int64_t C);

}  // namespace kiln

// Llama 3 hyper-parameters, parameter count and training FLOPs: the llama family's
// (models/llama/) and the LLaVA decoder's (models/llava/).
//
// Shapes as Meta's Llama 3 (Grattafiori et al. 2024, "The Llama 3 Herd of Models",
// table 3) and Hugging Face's LlamaConfig: hidden_size = n_embd, intermediate_size =
// ffn_hidden_size, num_key_value_heads = n_kv_head, rms_norm_eps = norm_eps, rope_theta
// and rope_scaling {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings} = rope, tie_word_embeddings = tie_embeddings.
// Qwen3's additions (Qwen3Config): head_dim, which need not be hidden_size /
// num_attention_heads, and qk_norm (its attention's q_norm / k_norm, always on in Qwen3).
// The presets (llama3.2-1b, ..) are in its registry entry (arch.cpp).
// Mixture of experts (issue 38; the [model] moe.* keys, LlamaMoeConfig): blocks chosen by
// is_moe_block() hold a MoeMlp (nn/moe.h) in place of the dense SwiGLU MLP.
#pragma once

#include "backend/backend.h"
#include "models/model_options.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

/// The [model] moe.* keys of a Llama (num_experts 0: a dense model). Block l is a MoE
/// block iff num_experts > 0, l >= first_k_dense, (l + 1) % sparse_step == 0 and l is not
/// in dense_layers.
struct LlamaMoeConfig {
  int num_experts = 0;      // E, routed experts
  int top_k = 2;            // k, experts per token (1 <= k <= E)
  int ffn_hidden_size = 0;  // F_e, each expert's SwiGLU width (resolved: 0 -> the dense F)
  int shared_experts = 0;   // one shared SwiGLU of width shared_experts * F_e (DeepSeek)
  std::string scoring = "softmax";  // "softmax" | "sigmoid"
  std::string routing = "top_k";    // "top_k" | "round_robin" (a test router)
  bool norm_topk_prob = true;       // renormalise the k chosen scores to sum 1
  int first_k_dense = 0;            // blocks 0..first_k_dense-1 dense (DeepSeek)
  int sparse_step = 1;              // Qwen3's decoder_sparse_step
  std::vector<int> dense_layers;    // blocks that stay dense, in [0, n_layer), each once
                                    // (Qwen3's mlp_only_layers; order as given)
  double aux_loss_coef = 0.0;       // load-balancing loss coefficient
  std::string aux_loss_type = "per_layer";     // "per_layer" | "hf"
  std::string aux_loss_scope = "micro_batch";  // "micro_batch" | "global" (models/moe_balance.h)
  double z_loss_coef = 0.0;                    // router z-loss coefficient (ST-MoE)
  bool expert_bias = false;          // DeepSeek-V3's auxiliary-loss-free selection bias
  double bias_update_rate = 1e-3;    // its step after each update; 0: frozen
  double capacity_factor = 0.0;      // > 0: token dropping past each expert's capacity

  bool enabled() const { return num_experts > 0; }
  bool operator==(const LlamaMoeConfig&) const = default;
};

struct LlamaConfig {
  int n_layer = 2;
  int n_head = 4;
  int n_kv_head = 2;         // grouped-query attention: n_head / n_kv_head queries per k/v head
  int n_embd = 64;           // C
  int explicit_head_dim = 0;  // [model] head_dim: the head size HD when > 0; 0: C / n_head
  bool qk_norm = false;      // per-head RMSNorm of q and k before rotary (Qwen3), eps norm_eps
  int ffn_hidden_size = 0;   // F, the SwiGLU width (gate and up are [F, C] each)
  int vocab_size = 256;      // real vocabulary V
  int padded_vocab_size = 256;  // Vp >= V: rows of the embedding and the head
  int block_size = 1024;     // maximum sequence length (positions 0..block_size-1)
  float norm_eps = 1e-5f;
  RopeSpec rope{500000.0};   // theta and the Llama 3.1 rescaling (scale_factor 0: none)
  bool tie_embeddings = false;
  LlamaMoeConfig moe;

  /// The head size HD: explicit_head_dim, or n_embd / n_head when that is 0.
  int head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : n_embd / n_head; }
  /// The default SwiGLU width of a model of width C, as Meta's reference code: 2/3 of 4C
  /// rounded up to a multiple of 256.
  static int default_ffn_hidden_size(int n_embd);
  /// Whether block l holds a mixture of experts (see LlamaMoeConfig).
  bool is_moe_block(int l) const;
  /// Throws kiln::Error naming the [model] key of an impossible shape.
  void validate() const;
  /// Trainable parameters, the tied head counted once, padded rows excluded (Hugging
  /// Face's count: 1,235,814,400 for llama3.2-1b, 8,030,261,248 for llama3.1-8b; with
  /// qk_norm 2 HD gains more per block). A MoE block counts all of its parameters: the
  /// router E C, the experts 3 E F_e C, the shared experts 3 Fs C.
  int64_t num_parameters() const;
  /// The matmul weights a token meets in block l (the 6N rule's N): q/k/v (NH + 2 NKV)
  /// HD x C, o C x NH HD, and a dense block's gate, up and down 3 F C, or a MoE block's
  /// ACTIVE ones: the router E C, k experts 3 k F_e C and the shared experts 3 Fs C.
  double block_matmul_weights(int l) const;
  /// Training FLOPs per token at length T: 6 N + 12 L T NH HD, N the matmul weights a
  /// token meets (sum of block_matmul_weights; the head V x C; not the embedding
  /// look-up), the attention term as GPT-2's (QK^T and AV, 2 x 2 T NH HD forward, x3
  /// with backward, no causal halving). MoE blocks count their active parameters only.
  double flops_per_token(int T) const;
  std::string str() const;
};

/// Llama's own [model] keys (ModelArch::keys): n_kv_head, head_dim, qk_norm,
/// ffn_hidden_size, norm_eps, rope_theta, rope_scaling.{factor, low_freq_factor,
/// high_freq_factor, original_max_position} and tie_embeddings.
const ModelKeys& llama_keys();
/// ModelArch::check_options: n_kv_head divides n_head, head_dim is even (rotary),
/// high_freq_factor exceeds low_freq_factor when rope scaling is on; each error names the
/// key's source.
void llama_check_options(const ModelOptions& options, const KeySource& source);
/// The rotary settings of `options` (rope_theta, rope_scaling.*).
RopeSpec llama_rope_of(const ModelOptions& options);

/// The Llama of the [model] keys (vocabulary padded to a multiple of 128, ffn_hidden_size
/// 0 -> default_ffn_hidden_size, n_kv_head 0 -> n_head), validated. Throws kiln::Error
/// naming the key for an impossible shape or dropout > 0 (Llama has none).
LlamaConfig llama_config_of(const ModelOptions& options);
/// Writes every moe.* key of a MoE `moe` (num_experts > 0; a dense one writes none) into
/// options.family (choices as their index, bools 0 / 1) and options.family_lists, so that
/// a config's explicit value is checked against each (model.init_from of a folder).
void llama_set_moe_options(ModelOptions& options, const LlamaMoeConfig& moe);
/// Hyper-parameters as stored in a checkpoint's state ("model" object), and back.
nlohmann::json llama_config_json(const LlamaConfig& c);
/// The options a model.init_parts source must agree with when it fills a Llama of `c`
/// that another model holds (Model::part_options): its options without head_dim (a
/// different head size shows in the tensors' shapes) nor, with `has_head` false (a
/// decoder read for its hidden states), tie_embeddings.
ModelOptions llama_part_options(const LlamaConfig& c, bool has_head);
ModelOptions llama_options_from_json(const nlohmann::json& j);

}  // namespace kiln

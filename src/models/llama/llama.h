// Llama 3 (Grattafiori et al. 2024; Touvron et al. 2023): the model on the layer library.
//
// Token embedding (no position table), n_layer pre-norm blocks (RMSNorm -> rotary
// grouped-query causal attention -> residual, RMSNorm -> SwiGLU MLP -> residual; no
// biases), a final RMSNorm and the output head fused with the chunked cross-entropy
// (nn/classifier.h): its own lm_head [Vp, C], or the token embedding when
// tie_embeddings (Llama 3.2 1B/3B). Rotary in Hugging Face's rotate-half layout with
// rope_theta and the "llama3" frequency rescaling (backend.h RopeSpec, rope_inv_freq).
// Qwen3's attention with the keys head_dim (HD, which need not be C / NH) and qk_norm
// (per-head RMSNorm of q and k before rotary: nn/attention.h).
//
// Parameters, named as Hugging Face's LlamaForCausalLM where the layout is the same:
//   model.embed_tokens.weight                      [Vp, C] (rows >= V zero)
//   model.layers.{l}.input_layernorm.weight        [C]
//   model.layers.{l}.self_attn.qkv_proj.weight     [(NH + 2 NKV) HD, C]: HF's q_proj,
//       k_proj and v_proj stacked (rows [0, NH HD), then NKV HD each), one fused matmul
//   model.layers.{l}.self_attn.q_norm.weight       [HD] (qk_norm only)
//   model.layers.{l}.self_attn.k_norm.weight       [HD] (qk_norm only)
//   model.layers.{l}.self_attn.o_proj.weight       [C, NH HD]
//   model.layers.{l}.post_attention_layernorm.weight [C]
//   model.layers.{l}.mlp.gate_up_proj.weight       [2F, C]: HF's gate_proj (rows [0, F))
//       then up_proj (rows [F, 2F))
//   model.layers.{l}.mlp.down_proj.weight          [C, F]
//   a MoE block (LlamaConfig::is_moe_block; nn/moe.h) has in place of the two mlp ones:
//   model.layers.{l}.mlp.router.weight             [E, C]
//   model.layers.{l}.mlp.experts.gate_up_proj.weight [E, 2F_e, C] (gate rows first)
//   model.layers.{l}.mlp.experts.down_proj.weight  [E, C, F_e]
//   model.layers.{l}.mlp.shared_experts.gate_up_proj.weight [2Fs, C], ..down_proj.weight
//       [C, Fs] (moe.shared_experts > 0, Fs = shared_experts F_e)
//   model.norm.weight                              [C]
//   lm_head.weight                                 [Vp, C] (untied only; rows >= V zero)
// Initialisation: every matrix N(0, 0.02^2) (HF's initializer_range), the two residual
// projections (o_proj, down_proj) N(0, (0.02 / sqrt(2 n_layer))^2) as GPT-2 does; norm
// gains 1. Parts: 0 the embeddings (resident when tied: it is also the head), 1 + l
// block l, n_layer + 1 the head (final norm and lm_head; resident when untied: its loss
// gradient is made in forward). No dropout.
#pragma once

#include "models/decoder_model.h"
#include "models/llama_config.h"
#include "nn/tensor_parallel.h"

#include <memory>

namespace kiln {

struct LlamaLayers;
class LlamaKvCache;

class Llama final : public DecoderModel {
 public:
  Llama(const LlamaConfig& config, Backend& backend, const ModelStorage& storage = {});
  ~Llama() override;

  const LlamaConfig& config() const { return config_; }

  std::string arch() const override { return "llama"; }
  std::string describe() const override { return config_.str(); }
  nlohmann::json config_json() const override { return llama_config_json(config_); }
  // forward (DecoderModel): positions int32 [B,T] are the rotary angles (empty: 0..T-1).
  void set_dropout(bool, uint64_t, uint64_t) override {}  // no dropout in Llama
  double flops_per_token(int T) const override { return config_.flops_per_token(T); }
  int64_t num_parameters() const override { return config_.num_parameters(); }
  int vocab_size() const override { return config_.vocab_size; }
  int padded_vocab_size() const override { return config_.padded_vocab_size; }
  int max_positions() const override { return config_.block_size; }
  /// KV-cache decoding (caches [B, max_len, NKV HD] per layer); each decode() runs
  /// tokens [B,Tq] at positions past..past+Tq-1 and writes the last position's logits
  /// fp32 [B,Vp].
  void begin_decode(int B, int max_len) override;
  void decode(const Tensor& tokens, const Tensor& logits) override;
  void end_decode() override;
  int decoded_length() const override;

 private:
  /// The output projection's weight: lm_head, or the token embedding when tied.
  const Tensor& head_weight() const;
  /// The output projection's placement (lm_head's, or the tied embedding's).
  const nn::TpPlacement& head_placement() const;

  LlamaConfig config_;
  std::unique_ptr<LlamaLayers> layers_;
  std::unique_ptr<LlamaKvCache> cache_;  // decoding
};

}  // namespace kiln

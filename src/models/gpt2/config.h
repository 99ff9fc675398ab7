// GPT-2 hyper-parameters, presets, parameter count and training FLOPs.
//
// Presets follow Radford et al. 2019 ("Language Models are Unsupervised Multitask
// Learners", table 2) and Hugging Face's gpt2* configs.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

struct GPT2Config {
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  int vocab_size = 50257;         // real vocabulary V: ids the tokenizer can produce
  int padded_vocab_size = 50304;  // Vp >= V, rows of the embedding (a multiple of 128 by default)
  int block_size = 1024;          // maximum sequence length (rows of the position table)
  float dropout = 0.f;            // embedding, attention-probability and residual dropout
  float layernorm_eps = 1e-5f;

  /// "gpt2" (124M), "gpt2-medium" (350M), "gpt2-large" (774M), "gpt2-xl" (1558M).
  /// Throws kiln::Error naming the unknown preset.
  static GPT2Config preset(std::string_view name);
  /// V rounded up to a multiple of `multiple` (50257 -> 50304 with 128).
  static int pad_vocab(int vocab_size, int multiple = 128);
  /// Throws kiln::Error for an impossible shape (e.g. n_embd not divisible by n_head).
  void validate() const;

  /// Number of trainable parameters, counting the tied embedding once, the position
  /// table included and the padded vocabulary rows excluded (Hugging Face's count:
  /// 124,439,808 for "gpt2").
  int64_t num_parameters() const;
  /// N in the 6N rule: the parameters a token's matmuls touch, i.e. num_parameters()
  /// minus the position table (a lookup, no FLOPs), with the tied embedding counted
  /// once as the output projection (its lookup is free), padded rows excluded.
  int64_t num_flop_parameters() const;
  /// Training FLOPs per token at sequence length T: 6 N + 12 * n_layer * T * n_embd.
  /// 6 N: 2 N forward + 4 N backward for the matmuls with N = num_flop_parameters().
  /// Attention: QK^T and AV are 2 * 2 * T * C FLOPs per token per layer forward, x3
  /// for forward + backward, counted without the causal halving (PaLM, Chowdhery et
  /// al. 2022, appendix B; nanoGPT's estimate_mfu).
  double flops_per_token(int T) const;
  std::string str() const;
};

struct ModelOptions;
/// GPT-2 of the [model] keys: the vocabulary padded to a multiple of 128, not validated
/// (the model validates).
GPT2Config gpt2_config_of(const ModelOptions& options);

/// Hyper-parameters as stored in a checkpoint's state ("model" object); from_json
/// validates.
nlohmann::json gpt2_config_json(const GPT2Config& c);
GPT2Config gpt2_config_from_json(const nlohmann::json& j);
/// The [model] keys of a checkpoint's "model" object (validated as from_json; arch "gpt2").
/// A model built from them has the vocabulary padded to a multiple of 128 again.
ModelOptions gpt2_options_from_json(const nlohmann::json& j);

}  // namespace kiln

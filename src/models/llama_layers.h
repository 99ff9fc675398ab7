// Llama's layers (models/llama/llama.h lists them and their names) and its KV-cache
// decoding, shared by the Llama language model (models/llama/) and the models that hold
// one as their decoder (models/llava/).
#pragma once

#include "models/layered_model.h"
#include "models/layer_plan.h"
#include "models/llama_config.h"
#include "models/moe_balance.h"
#include "nn/block.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/norm.h"

#include <optional>
#include <string>
#include <vector>

namespace kiln {

/// Block l's spec: a MoE block (c.is_moe_block(l)) holds a MoeMlp named "mlp".
nn::BlockSpec llama_block_spec(const LlamaConfig& c, int l);
/// The MoE blocks' balancing losses as the config sets them.
MoeBalanceSpec llama_balance_spec(const LlamaConfig& c);

/// The layers, named as Hugging Face's LlamaForCausalLM (llama.h lists the names) after
/// `prefix` ("language_model." in a LLaVA; "" in a Llama).
struct LlamaLayers {
  explicit LlamaLayers(const LlamaConfig& c, const std::string& prefix = "");

  /// The parts: embeddings, each block, the head (final norm, lm_head when untied).
  /// Costs: the matmul weights a token meets in the part (the 6N rule's N; a MoE block's
  /// active ones, LlamaConfig::block_matmul_weights).
  std::vector<PartLayout> parts(const LlamaConfig& c);
  /// The layers by role and Llama's plans (the decoders': models/decoder_model.h), for a
  /// LayerPlan.
  LayerRoles roles();
  /// The output projection: lm_head, or the token embedding when tied.
  nn::Param& head_weight() { return lm_head ? lm_head->weight : embedding.wte; }
  const nn::TpPlacement& head_placement() const {
    return lm_head ? lm_head->placement() : embedding.placement();
  }

  nn::TokenPositionEmbedding embedding;
  std::vector<nn::TransformerBlock> blocks;
  nn::Norm norm;
  std::optional<nn::Linear> lm_head;
};

/// KV-cache decoding through Llama's blocks (Pope et al. 2022 call the two phases prefill
/// and decode), whatever embedded the inputs: caches [B, max_len, NKV HD] per layer.
class LlamaKvCache {
 public:
  /// Allocates the caches (Temporaries) for B sequences of up to max_len positions.
  /// Throws kiln::Error when max_len exceeds block_size or the layers are tensor-parallel.
  void begin(Backend& be, const LlamaConfig& c, const LlamaLayers& layers, DType dtype, int B,
             int max_len);
  void end();
  /// Sequences (0: no decoding begun) and positions cached so far.
  int batch() const { return B_; }
  int past() const { return past_; }
  /// Runs the embedded inputs x [B,Tq,C] (overwritten) at positions past .. past+Tq-1
  /// through the blocks, caching their keys and values, and writes the final norm of each
  /// sequence's last position to out [B,C]; then past += Tq. Throws kiln::Error without
  /// begin(), for another B, or past the cache.
  void run(Backend& be, const LlamaLayers& layers, const Tensor& x, const Tensor& out);
  /// run() of the embeddings of tokens int32 [B,Tq]: the final norm of each sequence's last
  /// position into out [B,C] (for the caller's logits). Throws as run().
  void decode(Backend& be, const LlamaLayers& layers, const Tensor& tokens, const Tensor& out);

 private:
  int B_ = 0, max_len_ = 0, past_ = 0;
  std::vector<Tensor> k_, v_;
};

}  // namespace kiln

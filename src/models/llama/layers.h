// Llama's layers (models/llama/llama.h lists them and their names), shared by the Llama
// language model and the models that embed one (models/llava/).
#pragma once

#include "models/layered_model.h"
#include "models/layer_plan.h"
#include "models/llama/config.h"
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

}  // namespace kiln

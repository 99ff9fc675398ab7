// The parallel plans as data: a model family's tables from layer role to placement
// (TensorParallelTable, ContextParallelTable: its ParallelTables), stated beside the
// family's code (the decoders' in models/decoder_model.h), and LayerRoles, the model's
// layers by role with the family's tables, which src/parallel's plans (LayerPlan) apply
// before the model lays out its parameters (torchtitan's parallelize_module over a plan
// dict; Megatron-LM's layer specs).
#pragma once

#include "nn/tensor_parallel.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln {
namespace nn {
class Linear;
class Norm;
class TokenPositionEmbedding;
class TransformerBlock;
}  // namespace nn

/// A family's tensor-parallel plan: the style (nn::TpStyle, nn/tensor_parallel.h) of each
/// layer role. The layers take the placement they are given and refuse a style they cannot
/// run: the embedding Vocab or Replicated; each pair of Linears Column then Row or both
/// Replicated; the norms Sequence or Replicated; lm_head Column (the vocab-parallel loss)
/// or Replicated. Sequence parallelism needs every role split or sequence-parallel.
struct TensorParallelTable {
  nn::TpStyle embedding = nn::TpStyle::Replicated;       // the token (and position) table
  nn::TpStyle attention_qkv = nn::TpStyle::Replicated;   // each block's fused q/k/v projection
  nn::TpStyle attention_proj = nn::TpStyle::Replicated;  // each block's attention output
  nn::TpStyle mlp_fc = nn::TpStyle::Replicated;          // each block's MLP input projection
  nn::TpStyle mlp_proj = nn::TpStyle::Replicated;        // each block's MLP output projection
  nn::TpStyle norms = nn::TpStyle::Replicated;           // each block's two norms
  nn::TpStyle final_norm = nn::TpStyle::Replicated;
  nn::TpStyle lm_head = nn::TpStyle::Replicated;  // untied output projection (tied: embedding)

  /// (role, style) in the order above; roles named "embedding", "attention.qkv",
  /// "attention.proj", "mlp.fc", "mlp.proj", "norms", "final_norm", "lm_head".
  std::vector<std::pair<std::string, nn::TpStyle>> roles() const;
};

inline std::vector<std::pair<std::string, nn::TpStyle>> TensorParallelTable::roles() const {
  return {{"embedding", embedding}, {"attention.qkv", attention_qkv},
          {"attention.proj", attention_proj}, {"mlp.fc", mlp_fc}, {"mlp.proj", mlp_proj},
          {"norms", norms}, {"final_norm", final_norm}, {"lm_head", lm_head}};
}

/// A family's context-parallel plan: which attention layers take the ring (ring attention
/// over the cp group, nn/context_parallel.h). Every other layer works on the rank's rows
/// of each sequence alone.
struct ContextParallelTable {
  bool attention = false;  // each block's self-attention (causal or bidirectional)
};

/// A family's parallel plans, stated once beside its code (nullopt: the family states
/// none, so it cannot take that plan).
struct ParallelTables {
  std::optional<TensorParallelTable> tp;
  std::optional<ContextParallelTable> cp;
};

/// A model's layers by role, as a plan applied from outside sees them, with the family's
/// plan tables.
struct LayerRoles {
  std::string arch;  // model.arch (its registry entry; messages)
  ParallelTables tables;
  nn::TokenPositionEmbedding* embedding = nullptr;
  std::vector<nn::TransformerBlock*> blocks;
  nn::Norm* final_norm = nullptr;
  nn::Linear* lm_head = nullptr;  // an untied output projection; nullptr when tied to wte
};

/// Changes a model's layers before it lays out its parameters: src/parallel's
/// tensor-parallel plan installs the placements its table states (nn/tensor_parallel.h)
/// on the layers this way and the context-parallel plan the ring (nn/context_parallel.h),
/// so no model names a style or calls a collective. Not owned by the model.
class LayerPlan {
 public:
  virtual ~LayerPlan() = default;
  /// What the plan does, for a model that cannot take it: "tensor parallelism (parallel.tp
  /// = 2)".
  virtual std::string what() const = 0;
  /// Throws kiln::Error naming the arch and key, or the layer, when the model cannot take
  /// the plan.
  virtual void apply(const LayerRoles& layers) const = 0;
};

}  // namespace kiln

// LayerPlan: a change applied to a model's layers from outside, before the model lays out
// its parameters (src/parallel's tensor- and context-parallel plans), and LayerRoles, the
// model's layers by role as such a plan sees them.
#pragma once

#include <string>
#include <vector>

namespace kiln {
namespace nn {
class Linear;
class Norm;
class TokenPositionEmbedding;
class TransformerBlock;
}  // namespace nn

/// A language model's layers by role, as a plan applied from outside sees them.
struct LayerRoles {
  std::string arch;                                  // "gpt2", "llama"
  nn::TokenPositionEmbedding* embedding = nullptr;
  std::vector<nn::TransformerBlock*> blocks;
  nn::Norm* final_norm = nullptr;
  nn::Linear* lm_head = nullptr;  // an untied output projection; nullptr when tied to wte
};

/// Changes a model's layers before it lays out its parameters: src/parallel's
/// tensor-parallel plan installs the styles (nn/tensor_parallel.h) on the layers this way
/// and the context-parallel plan the ring (nn/context_parallel.h), so no model names a
/// style or calls a collective. Not owned by the model.
class LayerPlan {
 public:
  virtual ~LayerPlan() = default;
  /// What the plan does, for a model that cannot take it: "tensor parallelism (parallel.tp
  /// = 2)".
  virtual std::string what() const = 0;
  /// Throws kiln::Error naming the layer when the model cannot take the plan.
  virtual void apply(const LayerRoles& layers) const = 0;
};

}  // namespace kiln

// The tensor-parallel sharding plan: which style (nn/tensor_parallel.h) each layer role
// of a model takes, installed on the layers before the model lays out its parameters
// (torchtitan's parallelize_module; the layers are Megatron-LM's).
//
//   role        GPT-2                                   Llama
//   embedding   vocab-parallel (also the tied head)      vocab-parallel (and the tied head)
//   attention   heads split: c_attn column-parallel in q, k, v pieces, c_proj row-parallel
//   mlp         hidden units split: c_fc column-parallel (SwiGLU: gate and up pieces),
//               c_proj row-parallel
//   norms       replicated; under sequence parallelism each rank normalises its rows and
//               the gain and shift gradients are partial sums over tp
//   lm_head     (tied)                                  untied: column-parallel over the
//                                                       vocabulary rows
//   loss        vocab-parallel cross-entropy over the head weight's rows
//
// What the plan guarantees by construction: a partial sum never enters a norm (every
// row-parallel output is reduced, or reduce-scattered, before the residual add), and the
// only partial gradients are those marked tp_partial_grad (ParamSpec), each to be reduced
// over tp exactly once by the gradient sync.
#pragma once

#include "models/model.h"
#include "nn/tensor_parallel.h"

namespace kiln {

class TensorParallelPlan final : public LayerPlan {
 public:
  /// `group` is not owned and must outlive the model.
  TensorParallelPlan(nn::TpGroup& group, bool sequence_parallel)
      : group_(group), sequence_parallel_(sequence_parallel) {}
  /// Throws kiln::Error for an architecture without a plan, or naming the layer whose
  /// heads, key/value heads, hidden units or vocabulary rows do not divide over tp.
  void apply(const LayerRoles& layers) const override;
  std::string what() const override;

 private:
  nn::TpGroup& group_;
  bool sequence_parallel_;
};

}  // namespace kiln

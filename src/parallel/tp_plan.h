// The tensor-parallel plan: makes the placements (nn/tensor_parallel.h) of a model's
// layers from the table its family states (models/layer_plan.h TensorParallelTable; the
// decoders' in models/decoder_model.h) and installs them on the layers by role before the
// model lays out its parameters (torchtitan's parallelize_module; the layers are
// Megatron-LM's). Which Linear is split, and how, is that table's entry for its role; the
// layers' shard() runs the placement it is given (nn/linear.h, nn/attention.h, nn/mlp.h,
// nn/block.h, nn/embedding.h, nn/norm.h).
//
// Whether a model takes the plan is its registry entry's ModelArch::tensor_parallel and
// its table: without either the plan refuses it with one line naming the arch and
// parallel.tp. Under sequence parallelism every role of the table must be split or
// sequence-parallel (none replicated).
//
// What the decoders' table guarantees by construction: a partial sum never enters a norm
// (every row-parallel output is reduced, or reduce-scattered, before the residual add),
// and the only partial gradients are those marked tp_partial_grad (ParamSpec: the
// sequence-parallel norms'), each to be reduced over tp exactly once by the gradient sync.
#pragma once

#include "models/layer_plan.h"
#include "nn/block.h"
#include "nn/tensor_parallel.h"

namespace kiln {

class TensorParallelPlan final : public LayerPlan {
 public:
  /// `group` is not owned and must outlive the model.
  TensorParallelPlan(nn::TpGroup& group, bool sequence_parallel)
      : group_(group), sequence_parallel_(sequence_parallel) {}
  /// Throws kiln::Error naming the arch and parallel.tp for a model that does not take
  /// tensor parallelism (registry entry, table; a replicated role under sequence
  /// parallelism), or naming the layer whose style it cannot run or whose heads,
  /// key/value heads, hidden units or vocabulary rows do not divide over tp.
  void apply(const LayerRoles& layers) const override;
  std::string what() const override;

 private:
  nn::TpGroup& group_;
  bool sequence_parallel_;
};

/// The placements of one block under `table` over `group`: what apply() installs on each
/// block.
nn::BlockPlacement block_placement(const TensorParallelTable& table, nn::TpGroup& group,
                                   bool sequence_parallel);

}  // namespace kiln

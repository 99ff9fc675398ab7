#include "parallel/tp_plan.h"

#include "core/error.h"
#include "models/registry.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/norm.h"

#include <fmt/format.h>

namespace kiln {

std::string TensorParallelPlan::what() const {
  return fmt::format("tensor parallelism (parallel.tp = {})", group_.size());
}

nn::BlockPlacement block_placement(const TensorParallelTable& table, nn::TpGroup& group,
                                   bool sequence_parallel) {
  auto at = [&](nn::TpStyle style) { return nn::TpPlacement{style, &group, sequence_parallel}; };
  return {at(table.norms),
          {at(table.attention_qkv), at(table.attention_proj)},
          {at(table.mlp_fc), at(table.mlp_proj)}};
}

void TensorParallelPlan::apply(const LayerRoles& layers) const {
  if (group_.size() == 1) return;
  KILN_CHECK(model_arch(layers.arch).tensor_parallel, "{} is not supported for {} (its "
             "registry entry, ModelArch::tensor_parallel)", what(), layers.arch);
  KILN_CHECK(layers.tables.tp, "{} is not supported for {}: it states no tensor-parallel plan "
             "table (models/layer_plan.h)", what(), layers.arch);
  KILN_CHECK(layers.embedding && layers.final_norm && !layers.blocks.empty(),
             "{}: {} lacks the roles of the plan", what(), layers.arch);
  const TensorParallelTable& table = *layers.tables.tp;
  for (const auto& [role, style] : table.roles()) {
    const bool used = role != "lm_head" || layers.lm_head;  // a tied head is the embedding
    KILN_CHECK(!sequence_parallel_ || !used || style != nn::TpStyle::Replicated,
               "{} with parallel.sequence_parallel: {}'s plan keeps {} replicated (sequence "
               "parallelism needs every role split or sequence-parallel)", what(), layers.arch,
               role);
  }
  auto at = [&](nn::TpStyle style) { return nn::TpPlacement{style, &group_, sequence_parallel_}; };
  layers.embedding->shard(at(table.embedding));
  const nn::BlockPlacement block = block_placement(table, group_, sequence_parallel_);
  for (nn::TransformerBlock* b : layers.blocks) b->shard(block);
  layers.final_norm->shard(at(table.final_norm));
  if (layers.lm_head) layers.lm_head->shard(at(table.lm_head));
}

}  // namespace kiln

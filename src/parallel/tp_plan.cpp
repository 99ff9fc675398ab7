#include "parallel/tp_plan.h"

#include "core/error.h"
#include "nn/block.h"
#include "nn/embedding.h"
#include "nn/norm.h"

#include <fmt/format.h>

namespace kiln {

std::string TensorParallelPlan::what() const {
  return fmt::format("tensor parallelism (parallel.tp = {})", group_.size());
}

void TensorParallelPlan::apply(const LayerRoles& layers) const {
  if (group_.size() == 1) return;
  KILN_CHECK(layers.arch == "gpt2" || layers.arch == "llama",
             "tensor parallelism (parallel.tp = {}) is not supported for {} yet", group_.size(),
             layers.arch);
  KILN_CHECK(layers.embedding && layers.final_norm && !layers.blocks.empty(),
             "tensor parallelism: {} lacks the roles of the plan", layers.arch);
  layers.embedding->shard(nn::TpPlacement{nn::TpStyle::Vocab, &group_, sequence_parallel_});
  for (nn::TransformerBlock* b : layers.blocks) b->shard(group_, sequence_parallel_);
  if (sequence_parallel_) layers.final_norm->mark_sequence_parallel();
  // An untied output projection: column-parallel over the vocabulary (its weight's rows),
  // the loss vocab-parallel over them.
  if (layers.lm_head) {
    layers.lm_head->shard(nn::TpPlacement{nn::TpStyle::Column, &group_, sequence_parallel_});
  }
}

}  // namespace kiln

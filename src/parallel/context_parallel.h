// Context parallelism from outside the model: the layers' ring (nn::CpGroup) over a
// Communicator, the plan that installs it on the attention layers the model's
// context-parallel table names (models/layer_plan.h ContextParallelTable; the decoders'
// in models/decoder_model.h), and the split of a micro-batch's host tokens into a rank's
// chunks (nn/context_parallel.h has the split and the ring attention itself). Whether a
// model takes the plan is its registry entry's ModelArch::context_parallel and its table.
#pragma once

#include "comm/communicator.h"
#include "models/model.h"
#include "nn/context_parallel.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace kiln {

/// nn::CpGroup over `comm` (the DeviceMesh's cp communicator): a shift is a send to rank
/// + 1 and a receive from rank - 1 posted as one group (Communicator::group_start), so
/// that it runs while the caller computes.
class CommCpGroup final : public nn::CpGroup {
 public:
  /// `comm` is not owned and must outlive the group.
  explicit CommCpGroup(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  std::unique_ptr<Transfer> shift(Stream s, const Tensor& send, const Tensor& recv,
                                  int tag) override;
 private:
  Communicator& comm_;
};

/// Installs the ring on the attention layers the model's context-parallel table puts on
/// it.
class ContextParallelPlan final : public LayerPlan {
 public:
  /// `group` is not owned and must outlive the model.
  explicit ContextParallelPlan(nn::CpGroup& group) : group_(group) {}
  /// Throws kiln::Error naming the arch and parallel.cp for a model whose registry entry
  /// (ModelArch::context_parallel) refuses context parallelism or that states no
  /// context-parallel table.
  void apply(const LayerRoles& layers) const override;
  std::string what() const override;

 private:
  nn::CpGroup& group_;
};

/// local [B, P, ...] <- the columns `positions` (P of them, a cp rank's: nn::cp_positions)
/// of full [B, T, ...] (row-major; each token's entry `token_bytes` long: tokens, targets,
/// or any per-token batch input).
void cp_split_rows(std::byte* local, const std::byte* full, int64_t B, int64_t T,
                   int64_t token_bytes, std::span<const int32_t> positions);

}  // namespace kiln

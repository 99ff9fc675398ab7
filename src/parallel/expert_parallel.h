// Expert parallelism from outside the model (issue 40): the layers' all-to-all group
// (nn::EpGroup) over a Communicator, and the plan that installs it on every
// mixture-of-experts layer before the model lays out its parameters, so that each rank of
// an ep group holds E / ep of every MoE layer's experts (nn/expert_parallel.h has the
// dispatch; parallel/mesh.h carves the ep group out of the dp x cp ranks).
//
// What the plan changes: the routed experts' weights ([E, 2F, C] and [E, C, F]) are cut on
// dimension 0 (nn::ParamSlice's ep cut; under tensor parallelism the tp cut of their
// hidden units applies within), and each MoE layer sends its slots to the experts' ranks
// and back. The router, the shared experts and everything else stay as they were: whole,
// or split by the tensor-parallel plan. Expert weights are reduced (and ZeRO-sharded) over
// the expert-data-parallel group, the rest over dp x cp (parallel/data_parallel.h).
#pragma once

#include "comm/communicator.h"
#include "models/layer_plan.h"
#include "nn/expert_parallel.h"

namespace kiln {

/// nn::EpGroup over `comm` (the DeviceMesh's ep communicator): an all_to_all (variable
/// counts) blocking on the caller's stream, counted in the communicator's statistics.
class CommEpGroup final : public nn::EpGroup {
 public:
  /// `comm` is not owned and must outlive the group.
  explicit CommEpGroup(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  void all_to_all_rows(Stream s, const Tensor& out, const Tensor& in,
                       std::span<const int64_t> send_rows,
                       std::span<const int64_t> recv_rows) override;
  Communicator& comm() const { return comm_; }

 private:
  Communicator& comm_;
};

class ExpertParallelPlan final : public LayerPlan {
 public:
  /// `group` is not owned and must outlive the model.
  explicit ExpertParallelPlan(nn::EpGroup& group) : group_(group) {}
  /// Throws kiln::Error naming the arch and parallel.ep for a model without
  /// mixture-of-experts blocks, or naming the layer whose experts do not divide over ep.
  void apply(const LayerRoles& layers) const override;
  std::string what() const override;

 private:
  nn::EpGroup& group_;
};

}  // namespace kiln

// The planner's expert-parallel group: what the MoE layers' dispatch would receive under
// the routing the plan models, on the meta backend (whose ops compute nothing, so the
// router's real counts do not exist). Its all-to-alls move nothing and complete at once
// (the buffers the layers allocate around them are what the plan counts); its count
// exchange (nn::EpGroup::exchange_counts) answers with the counts of the modelled routing,
// which size the received-token buffers ([R, C], [R, 2F], [R, F] per MoE layer and
// micro-batch, kept to backward; nn/moe.h):
//   balanced  every source rank sends each of this rank's El experts N k / E of its slots
//             (the round_robin test router's load): R = N k, as without ep;
//   worst     every source rank sends this rank min(k, El) slots of each of its N tokens
//             (a token's choices are distinct experts): R = ep N min(k, El), the most a
//             rank can receive (all the group's tokens routed to its experts).
#pragma once

#include "comm/communicator.h"
#include "nn/expert_parallel.h"
#include "plan/scratch_models.h"

namespace kiln::plan {

class PlannedEpGroup final : public nn::EpGroup {
 public:
  /// `comm` (not owned) is the ep group's simulated communicator (its size and rank);
  /// `tokens` the N tokens
  /// each MoE layer routes per call on a rank, k of E experts each.
  PlannedEpGroup(Communicator& comm, MoeRouting routing, int64_t tokens, int k, int64_t experts);
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  std::unique_ptr<Transfer> all_to_all_rows(Stream s, const Tensor& out, const Tensor& in,
                                            std::span<const int64_t> send_rows,
                                            std::span<const int64_t> recv_rows) override;
  void exchange_counts(Backend& be, Stream s, std::span<const int32_t> own,
                       std::span<int32_t> incoming) override;

 private:
  Communicator& comm_;
  MoeRouting routing_;
  int64_t tokens_, k_, experts_;
};

}  // namespace kiln::plan

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
/// counts) in flight on the communicator's thread or stream, counted in its statistics;
/// the seconds the layers wait for them are the exposed all-to-all time.
class CommEpGroup final : public nn::EpGroup {
 public:
  /// `comm` is not owned and must outlive the group.
  explicit CommEpGroup(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  std::unique_ptr<Transfer> all_to_all_rows(Stream s, const Tensor& out, const Tensor& in,
                                            std::span<const int64_t> send_rows,
                                            std::span<const int64_t> recv_rows) override;
  Communicator& comm() const { return comm_; }
  /// Seconds spent in the transfers' wait() since the last call (exposed, not hidden).
  double take_wait_seconds();

 private:
  Communicator& comm_;
  double wait_seconds_ = 0.0;
};


/// The all_to_all one rank of an ep group issues per update, dropless, under balanced
/// routing (each rank receives as many slots as it sends: the round_robin test router,
/// model.moe.routing): per MoE layer the rank holds and micro-batch of N tokens (M = N k
/// slots), forward exchanges the counts (E int32, one call) and sends the slots' rows to
/// their experts and back (2 M C activation elements, a call each way per chunk), backward
/// the outputs' gradients there and the inputs' gradients back (2 M C, likewise); a full
/// activation checkpointing recompute repeats forward's. Bytes as CommStats counts an all_to_all's: what the rank sends, its own
/// piece included.
struct EpTraffic {
  int64_t calls = 0, bytes = 0;
};
EpTraffic ep_update_traffic(int64_t moe_layers, int64_t micro_batches, int64_t tokens, int top_k,
                            int64_t experts, int64_t n_embd, int64_t act_bytes,
                            bool full_recompute);

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

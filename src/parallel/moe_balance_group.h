// A mixture of experts' balancing group (MoeBalanceGroup, models/model.h) over a
// Communicator: in a job, the dp x cp communicator, so that moe.aux_loss_scope "global"
// sums the balancing statistics over the data-parallel ranks. Its all-reduce is blocking
// on the caller's stream, counted in the communicator's statistics like any other.
#pragma once

#include "comm/communicator.h"
#include "models/model.h"

namespace kiln {

class CommMoeBalanceGroup final : public MoeBalanceGroup {
 public:
  /// `comm` is not owned and must outlive the group.
  explicit CommMoeBalanceGroup(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  void all_reduce_sum(Stream s, const Tensor& t) override { comm_.all_reduce(t, ReduceOp::Sum, s); }

 private:
  Communicator& comm_;
};

}  // namespace kiln

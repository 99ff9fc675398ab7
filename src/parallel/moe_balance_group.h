// A mixture of experts' balancing group (MoeBalanceGroup, models/model.h) over a
// Communicator: in a job, the cp communicator (a micro-batch's tokens spread over the
// context-parallel ranks) and the dp x cp one (moe.aux_loss_scope "global": the
// data-parallel ranks' micro-batches together). Its all-reduce is blocking on the caller's
// stream, counted in the communicator's statistics like any other.
#pragma once

#include "comm/communicator.h"
#include "comm/ledger.h"
#include "models/model.h"

namespace kiln {

class CommMoeBalanceGroup final : public MoeBalanceGroup {
 public:
  /// `comm` is not owned and must outlive the group.
  explicit CommMoeBalanceGroup(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  void all_reduce_sum(Stream s, const Tensor& t) override {
    const CommSite site("moe.all_reduce balance statistics");
    comm_.all_reduce(t, ReduceOp::Sum, s);
  }

 private:
  Communicator& comm_;
};

}  // namespace kiln

// The layers' tensor-parallel group (nn::TpGroup, nn/tensor_parallel.h) over a
// Communicator: in a job, the DeviceMesh's tp communicator. Its collectives are blocking
// on the caller's stream, counted in the communicator's statistics like any other.
#pragma once

#include "comm/communicator.h"
#include "comm/ledger.h"
#include "nn/tensor_parallel.h"

namespace kiln {

class CommTpGroup final : public nn::TpGroup {
 public:
  /// `comm` is not owned and must outlive the group.
  explicit CommTpGroup(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  void all_reduce_sum(Stream s, const Tensor& t) override {
    const CommSite site("tp.all_reduce activations");
    comm_.all_reduce(t, ReduceOp::Sum, s);
  }
  void all_gather_rows(Stream s, const Tensor& out, const Tensor& in) override {
    const CommSite site("tp.all_gather rows (sequence parallel)");
    comm_.all_gather(out, in, s);
  }
  void reduce_scatter_rows(Stream s, const Tensor& out, const Tensor& in) override {
    const CommSite site("tp.reduce_scatter rows (sequence parallel)");
    comm_.reduce_scatter(out, in, s);
  }
  Communicator& comm() const { return comm_; }

 private:
  Communicator& comm_;
};

}  // namespace kiln

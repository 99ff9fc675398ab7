// InProcessCommunicator: the half that the communicators with no other process to talk to
// share: LocalCommunicator (a world of one) and SimulatedCommunicator (one rank of a
// world that does not exist, for dry runs).
//
// Each call is checked exactly as every implementation checks it (Communicator's
// check_*), described ("all_reduce(sum, fp32[1024])"), counted in the statistics once it
// passes those checks (its nccl-tests size, 0 seconds), and then carried out by the
// implementation's issue(): copies and a mailbox, or nothing at all.
#pragma once

#include "comm/communicator.h"

#include <cstdint>
#include <memory>
#include <string>

namespace kiln {

class InProcessCommunicator : public Communicator {
 public:
  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum,
                                         Stream s = {}) final;
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& output, const Tensor& input,
                                             Stream s = {}) final;
  std::shared_ptr<Work> all_gather_async(const Tensor& output, const Tensor& input,
                                         Stream s = {}) final;
  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root, Stream s = {}) final;
  std::shared_ptr<Work> send_async(const Tensor& t, int peer, int tag, Stream s = {}) final;
  std::shared_ptr<Work> recv_async(const Tensor& t, int peer, int tag, Stream s = {}) final;
  std::shared_ptr<Work> barrier_async() final;
  std::shared_ptr<Work> all_to_all_async(const Tensor& output, const Tensor& input,
                                         std::span<const int64_t> send_counts,
                                         std::span<const int64_t> recv_counts,
                                         Stream s = {}) final;
  // (Default arguments repeat the base class's, so that calls on a LocalCommunicator or a
  // SimulatedCommunicator read the same as calls on a Communicator.)

 protected:
  using Communicator::Communicator;

  /// One call, checked and counted.
  struct CheckedCall {
    Collective kind;
    int64_t bytes = 0;        // as CommStats counts them
    std::string description;  // describe(): "send(fp32[8], tag 3)"
    Tensor buffer = {};  // the tensor of all_reduce, broadcast, send, recv;
                         // reduce_scatter's and all_gather's output; all_to_all's
                         // received pieces; none for barrier
    Tensor input = {};   // reduce_scatter's and all_gather's input; all_to_all's sent
                         // pieces
    int tag = 0;    // send, recv
  };
  /// Carries out `call` on stream `s`; returns its Work. May throw kiln::Error (checks of
  /// the implementation's own).
  virtual std::shared_ptr<Work> issue(const CheckedCall& call, Stream s) = 0;

 private:
  /// Counts `call` in the statistics, then issues it.
  std::shared_ptr<Work> count_and_issue(const CheckedCall& call, Stream s);
  /// reduce_scatter_async and all_gather_async after their checks (`kind` ReduceScatter
  /// or AllGather).
  std::shared_ptr<Work> scatter_or_gather(Collective kind, const Tensor& output,
                                          const Tensor& input, Stream s);
  /// send_async and recv_async (`kind` Send or Recv).
  std::shared_ptr<Work> point_to_point(Collective kind, const Tensor& t, int peer, int tag,
                                       Stream s);
};

}  // namespace kiln

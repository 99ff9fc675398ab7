// LocalCommunicator: the communicator of a single process (world size 1).
//
// Collectives over one rank: all_reduce and broadcast leave the buffer as it is,
// reduce_scatter and all_gather copy input to output, barrier returns at once, and
// send/recv to oneself (peer 0) pair up through an in-process mailbox matched by tag in
// order. Every call is checked exactly as the MPI communicator checks it, so a single
// process catches shape and dtype errors that a multi-rank run would hit.
//
// Copies run on the CPU; for device tensors pass the Backend whose copy() should be used.
#pragma once

#include "comm/communicator.h"

#include <deque>

namespace kiln {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::string name = "world", Backend* backend = nullptr);

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend_name() const override { return "local"; }

  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum,
                                         Stream s = {}) override;
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& output, const Tensor& input,
                                             Stream s = {}) override;
  std::shared_ptr<Work> all_gather_async(const Tensor& output, const Tensor& input,
                                         Stream s = {}) override;
  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root, Stream s = {}) override;
  std::shared_ptr<Work> send_async(const Tensor& t, int peer, int tag, Stream s = {}) override;
  std::shared_ptr<Work> recv_async(const Tensor& t, int peer, int tag, Stream s = {}) override;
  std::shared_ptr<Work> barrier_async() override;
  // (Default arguments repeat the base class's, so that calls on a LocalCommunicator
  // read the same as calls on a Communicator.)

 protected:
  std::unique_ptr<Communicator> make_group(const std::vector<int>& ranks,
                                           const std::string& name) override;
  std::unique_ptr<Communicator> make_split(int color, int key, const std::string& name) override;

 private:
  void copy(Stream s, const Tensor& dst, const Tensor& src);

  Backend* backend_;
  struct Message {
    int tag;
    std::vector<unsigned char> bytes;
  };
  struct PendingRecv {
    int tag;
    Tensor buffer;
    std::shared_ptr<Work> work;
  };
  std::mutex mailbox_mu_;
  std::deque<Message> messages_;  // sent, not yet received
  std::deque<PendingRecv> recvs_;  // posted, not yet matched
};

}  // namespace kiln

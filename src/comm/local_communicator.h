// LocalCommunicator: the communicator of a single process (world size 1).
//
// Collectives over one rank: all_reduce and broadcast leave the buffer as it is,
// reduce_scatter and all_gather copy input to output, barrier returns at once, and
// send/recv to oneself (peer 0) pair up through an in-process mailbox matched by tag in
// order. Every call is checked exactly as the MPI communicator checks it, so a single
// process catches shape and dtype errors that a multi-rank run would hit (the checks,
// descriptions and statistics are InProcessCommunicator's).
//
// Copies run on the CPU; for device tensors pass the Backend whose copy() should be used.
#pragma once

#include "comm/in_process_communicator.h"

#include <deque>
#include <mutex>

namespace kiln {

class LocalCommunicator final : public InProcessCommunicator {
 public:
  explicit LocalCommunicator(std::string name = "world", Backend* backend = nullptr);

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend_name() const override { return "local"; }

 protected:
  std::shared_ptr<Work> issue(const CheckedCall& call, Stream s) override;
  std::unique_ptr<Communicator> make_group(const std::vector<int>& ranks,
                                           const std::string& name) override;
  std::unique_ptr<Communicator> make_split(int color, int key, const std::string& name) override;

 private:
  void copy(Stream s, const Tensor& dst, const Tensor& src);
  /// Send and recv to oneself, through the mailbox (host tensors only).
  std::shared_ptr<Work> send_to_self(const CheckedCall& call);
  std::shared_ptr<Work> recv_from_self(const CheckedCall& call);

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

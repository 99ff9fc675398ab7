// SimulatedCommunicator: one rank of a world that does not exist, for dry runs.
//
// rank() and size() are whatever it was built with; every collective checks its
// arguments exactly as the real communicators do (shapes, dtypes, peers: the checks,
// descriptions and statistics are InProcessCommunicator's) and then completes without
// touching any memory (buffers may be a MetaBackend's fake addresses).
// Each call is recorded (kind, nccl-tests "size" in bytes as Communicator::stats()
// counts it, and the caller's current phase label), so that a planner can price the
// communication of a step afterwards.
//
// Completion: a Work is complete once is_completed() has been asked `completion_polls`
// times, or once it or any LATER operation of this communicator is waited for
// (operations complete in submission order, as on kiln's MPI communication thread).
//   0        at once
//   1        one poll later: each collective overlaps the compute up to the next hook of
//            the data-parallel wrapper (communication keeps pace with compute)
//   INT_MAX  never on its own: only a wait completes it (communication falls behind
//            compute; buffers freed on completion pile up until the step waits)
// Ranks never exchange anything: received values are left as they are.
#pragma once

#include "comm/in_process_communicator.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

class SimulatedCommunicator final : public InProcessCommunicator {
 public:
  struct Call {
    Collective kind;
    int64_t bytes;      // as CommStats counts them
    std::string phase;  // set_phase() at the time of the call
  };

  SimulatedCommunicator(int size, int rank, std::string name = "world", int completion_polls = 0);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "simulated"; }

  /// A label stored with each following call ("forward", "backward", "optimizer", ...).
  void set_phase(std::string phase) { phase_ = std::move(phase); }
  /// Every call so far, in order.
  const std::vector<Call>& calls() const { return calls_; }


 protected:
  /// Records the call with the current phase; touches no memory.
  std::shared_ptr<Work> issue(const CheckedCall& call, Stream s) override;
  /// Groups and splits are simulated too: rank i of a group is ranks[i]; a split puts
  /// this rank alone with the ranks of the same color, which the simulation cannot know,
  /// so it makes a group of size 1.
  std::unique_ptr<Communicator> make_group(const std::vector<int>& ranks,
                                           const std::string& name) override;
  std::unique_ptr<Communicator> make_split(int color, int key, const std::string& name) override;

 private:

  int size_, rank_, polls_;
  int64_t issued_ = 0;  // sequence number of the last operation
  std::shared_ptr<std::atomic<int64_t>> waited_ = std::make_shared<std::atomic<int64_t>>(0);
  std::string phase_;
  std::vector<Call> calls_;
};

}  // namespace kiln

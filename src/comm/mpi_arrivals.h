// The arrival record of an MPI communicator (internal to kiln_comm; includes mpi.h): who
// has reached which collective, so that a timeout names the ranks that never arrived.
//
// Every collective of a communicator gets the next number, the same on every rank (all
// ranks call the same collectives in the same order). When a rank starts collective #s
// it sends s, one int64, to every other rank on a private duplicate of the communicator
// (MPI_Isend, eager: nothing waits for the receiver), and records it for itself. Every
// rank's communication engine receives these announcements while it polls its
// operations and keeps, per rank, the highest number announced. When a wait for #s times
// out, the ranks whose number is below s are the ones that did not arrive: stopped
// (SIGSTOP), hung in computation, crashed before MPI noticed, or lagging in another
// collective. A rank that did arrive but stopped inside the collective is caught by the
// heartbeat: while a rank has operations in flight it repeats its latest number every
// kHeartbeatS seconds, so a rank not heard from for kSilentS seconds is reported silent.
// Cost: size - 1 messages of 8 bytes per collective per rank, plus the heartbeats while
// waiting; the record is kept only for communicators of at most kMaxRanks ranks.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kiln::comm_detail {

class Arrivals {
 public:
  static constexpr int kMaxRanks = 256;
  static constexpr double kHeartbeatS = 0.25;
  static constexpr double kSilentS = 1.5;
  /// `comm` is duplicated (collective over it: call where its MPI calls run).
  Arrivals(MPI_Comm comm, int rank, int size, std::string name);
  /// Stops the record, after draining what arrived and completing its sends; the
  /// duplicate stays allocated until MPI_Finalize (see close() in the .cpp). Call where
  /// MPI calls run.
  void close();

  /// The next collective's number (caller's thread, in submission order).
  int64_t next() { return ++issued_; }
  /// This rank starts collective #s: tell every other rank (engine thread).
  void announce(int64_t s);
  /// Receives pending announcements and reaps completed sends (engine thread).
  void poll();
  /// "rank 3 did not arrive (collective #12 of 'world'; its last was #11)"; when every
  /// rank arrived, the silent ones ("rank 1 arrived at collective #12 of 'world' but has
  /// been silent for 3.0 s"), or a sentence saying that none is. Any thread.
  std::string missing(int64_t s) const;

 private:
  MPI_Comm hb_ = MPI_COMM_NULL;
  int rank_, size_;
  std::string name_;
  std::atomic<int64_t> issued_{0};
  std::unique_ptr<std::atomic<int64_t>[]> seen_;   // [size]: highest number announced
  std::unique_ptr<std::atomic<int64_t>[]> heard_;  // [size]: steady-clock ns of the last message
  int64_t last_sent_ns_ = 0;                        // engine thread only
  void send_all(int64_t value);
  struct Send {
    MPI_Request request;
    std::unique_ptr<int64_t> value;
  };
  std::deque<Send> sends_;  // engine thread only
};

}  // namespace kiln::comm_detail

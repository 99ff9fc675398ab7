// The arrival record of an MPI communicator (internal to kiln_comm; includes mpi.h): who
// has reached which collective, so that a timeout names the ranks that never arrived.
//
// Every collective of a communicator gets the next number, the same on every rank (all
// ranks call the same collectives in the same order): its number in the collective ledger
// (ledger.h). When a rank starts collective #s it sends an Announcement (s, the operation,
// dtype, element count, root and call site; 88 bytes) to every other rank on a private
// duplicate of the communicator (MPI_Isend, eager: nothing waits for the receiver), and
// records it for itself. Each rank compares the others' announcements of #s with its own:
// another operation, dtype, element count or root is a bug that MPI would turn into a hang,
// a crash or wrong sums, so the job ends at once naming both ranks and call sites; a
// different call site alone is remembered (the first one) and reported if the job hangs.
// Every
// rank's communication engine receives these announcements while it polls its
// operations and keeps, per rank, the highest number announced. When a wait for #s times
// out, the ranks whose number is below s are the ones that did not arrive: stopped
// (SIGSTOP), hung in computation, crashed before MPI noticed, or lagging in another
// collective. A rank that did arrive but stopped inside the collective is caught by the
// heartbeat: while a rank has operations in flight it repeats its latest number every
// kHeartbeatS seconds, so a rank not heard from for kSilentS seconds is reported silent.
// Cost: size - 1 messages of 88 bytes per collective per rank, plus the heartbeats while
// waiting; the record is kept only for communicators of at most kMaxRanks ranks.
#pragma once

#include "comm/ledger.h"

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kiln::comm_detail {

/// What a rank announces when it starts a collective (and repeats as its heartbeat).
struct Announcement {
  int64_t seq = 0;
  int64_t count = 0;
  int32_t op = 0;     // Collective
  int32_t dtype = 0;  // DType
  int32_t root = -1;  // broadcast's root, else -1
  char site[CommSite::kCommSiteChars] = {};
  int32_t pad = 0;
};

/// The announcement of a ledger entry of a collective.
Announcement announcement_of(const LedgerEntry& e);

class Arrivals {
 public:
  static constexpr int kMaxRanks = 256;
  static constexpr double kHeartbeatS = 0.25;
  static constexpr double kSilentS = 1.5;
  static constexpr int kRecent = 64;  // announcements kept per rank for the comparison
  /// `comm` is duplicated (collective over it: call where its MPI calls run);
  /// `world_ranks[r]` names rank r in messages.
  Arrivals(MPI_Comm comm, int rank, std::vector<int> world_ranks, std::string name);
  /// Stops the record, after draining what arrived and completing its sends; the
  /// duplicate stays allocated until MPI_Finalize (see close() in the .cpp). Call where
  /// MPI calls run.
  void close();

  /// This rank starts collective #a.seq: tell every other rank and compare with what they
  /// announced (engine thread). Ends the job (abort_all) on a mismatch.
  void announce(const Announcement& a);
  /// Receives pending announcements and reaps completed sends (engine thread).
  void poll();
  /// "rank 3 did not arrive (collective #12 of 'world'; its last was #11)"; when every
  /// rank arrived, the silent ones ("rank 1 arrived at collective #12 of 'world' but has
  /// been silent for 3.0 s"), or a sentence saying that none is. Any thread.
  std::string missing(int64_t s) const;

 private:
  std::string missing_ranks(int64_t s) const;
  MPI_Comm hb_ = MPI_COMM_NULL;
  int rank_, size_;
  std::vector<int> world_ranks_;
  std::string name_;
  std::unique_ptr<std::atomic<int64_t>[]> seen_;   // [size]: highest number announced
  std::unique_ptr<std::atomic<int64_t>[]> heard_;  // [size]: steady-clock ns of the last message
  mutable std::mutex recent_mu_;
  std::vector<Announcement> recent_;  // [size * kRecent]: rank r's #s at r * kRecent + s % kRecent
  std::string first_disagreement_;    // guarded by recent_mu_
  int64_t last_sent_ns_ = 0;          // engine thread only
  Announcement latest_;               // engine thread only: this rank's latest
  void send_all(const Announcement& a);
  /// Keeps rank r's announcement and compares it with the other ranks' of the same number
  /// (recent_mu_ held).
  void keep_and_compare(int r, const Announcement& a);
  /// "all_reduce fp32[4] at 'x'" as rank r announced it.
  std::string what(const Announcement& a) const;
  struct Send {
    MPI_Request request;
    std::unique_ptr<Announcement> value;
  };
  std::deque<Send> sends_;  // engine thread only
};

}  // namespace kiln::comm_detail

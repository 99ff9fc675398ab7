// The collective ledger: what each communicator of this process was asked to do, in order,
// so that a hang or a failure can say where every rank was (docs/reliability.md, "The
// collective ledger").
//
// Every call on an MPI or NCCL communicator is recorded when it is submitted, in a bounded
// ring kept on the host (the last kLedgerEntries calls of each communicator):
//   seq     collectives: the communicator's collective number, the same on every member
//           (all members call the same collectives in the same order); the MPI arrival
//           record (mpi_arrivals.h) announces this number, there is no second numbering.
//           send/recv: the number of sends to (receives from) that peer on this
//           communicator, so that a rank's send #k is the peer's receive #k.
//   op, dtype, count (elements; all_to_all: those this rank sends), peer (send/recv: the
//   other rank; broadcast: the root; else -1), the call site, and when it was submitted
//   and completed.
// The call site is the innermost CommSite alive on the submitting thread, e.g.
//   CommSite site("dp.reduce_scatter part {}", 7);
//   comm.reduce_scatter_async(...);          // recorded at "dp.reduce_scatter part 7"
// Callers outside kiln_comm (src/parallel, src/train) name their calls this way; a call
// with no CommSite is recorded at "" (shown as "an untagged call").
//
// On a timeout, a failing rank (abort_all) or a stop signal while blocked, each rank
// writes its ledger's tail to <ledger dir>/rank-<R>.jsonl (set_ledger_dir; the trainer
// uses <run dir>/ledger), and the first rank that times out reads the others' files and
// prints a diagnosis (comm/diagnosis.h).
#pragma once

#include "comm/communicator.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace kiln {

/// Names the communicator calls made on this thread while it is alive (nested sites: the
/// innermost wins; the previous one comes back at destruction). Text past
/// kCommSiteChars - 1 characters is cut.
class CommSite {
 public:
  static constexpr size_t kCommSiteChars = 56;
  explicit CommSite(std::string_view text);
  template <class... Args>
    requires(sizeof...(Args) > 0)
  explicit CommSite(fmt::format_string<Args...> f, Args&&... args)
      : CommSite(std::string_view(fmt::format(f, std::forward<Args>(args)...))) {}
  ~CommSite();
  CommSite(const CommSite&) = delete;
  CommSite& operator=(const CommSite&) = delete;

  /// The innermost site of this thread; "" when none.
  static const char* current();

 private:
  char text_[kCommSiteChars];
  const CommSite* previous_;
};

/// One recorded call.
struct LedgerEntry {
  int64_t seq = 0;
  Collective op = Collective::Barrier;
  DType dtype = DType::F32;
  int64_t count = 0;
  int peer = -1;
  char site[CommSite::kCommSiteChars] = {};
  int64_t submitted_ns = 0;  // system clock (comparable across ranks), ns since the epoch
  int64_t done_ns = 0;       // 0 while in flight
};

/// "all_reduce fp32[1024]", "send fp32[8] to 2", "broadcast fp32[8] from 0", "barrier"
/// (`peer` < 0: no peer named).
std::string describe_call(Collective op, DType dtype, int64_t count, int peer);
/// "'dp.grad bucket 3'" or "an untagged call".
std::string describe_site(std::string_view site);

inline constexpr size_t kLedgerEntries = 512;

/// The ledger of one communicator. Thread-safe: calls are submitted on the caller's thread
/// and completed on the communication thread.
class Ledger {
 public:
  /// `world_ranks[i]`: the world rank of this communicator's rank i.
  Ledger(std::string group, int rank, std::vector<int> world_ranks);

  /// Records a call at the current CommSite; returns its entry (seq filled in). Collectives
  /// take the next collective number; send/recv the next number for (peer, direction).
  LedgerEntry add(Collective op, DType dtype, int64_t count, int peer);
  /// Marks the entry with this op and seq done (a no-op once it has left the ring).
  void done(Collective op, int64_t seq, int peer);

  const std::string& group() const { return group_; }
  int rank() const { return rank_; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  /// The last `n` entries, oldest first.
  std::vector<LedgerEntry> tail(size_t n = kLedgerEntries) const;

 private:
  std::string group_;
  int rank_;
  std::vector<int> world_ranks_;
  mutable std::mutex mu_;
  std::vector<LedgerEntry> ring_;  // kLedgerEntries slots
  int64_t added_ = 0;              // entries ever added
  int64_t collectives_ = 0;
  std::vector<int64_t> sends_, recvs_;  // per peer
};

/// The ledgers of every live communicator of this process (for dumps).
void register_ledger(const std::shared_ptr<Ledger>& ledger);
void unregister_ledger(const Ledger* ledger);

/// Where rank files go: "<dir>/rank-<R>.jsonl"; "" (the default) keeps the ledger in memory
/// only. Removes what an earlier run left: this rank's file, and on world rank 0 the
/// diagnosis and the files of ranks beyond this world. Never throws; the folder is made
/// when a file is first written. Call once the world communicator exists.
void set_ledger_dir(const std::string& dir);
std::string ledger_dir();

/// Writes this process's ledger tail (every registered communicator) to its rank file,
/// atomically, with `reason` (why it was written); returns the path, or "" when no ledger
/// dir is set or the write failed (never throws). At most once per process: later calls
/// return the first path.
std::string write_ledger_file(std::string_view reason);

/// After this rank failed on `what` (a timed-out wait's description): writes its ledger
/// file, waits up to `gather_s` seconds for the other ranks' files, and, when it is the
/// first rank to get there, prints the diagnosis (diagnosis.h) to stderr and writes it to
/// <dir>/diagnosis.txt. When its own file cannot be written, prints this rank's own view
/// instead; without a ledger dir, nothing (the timeout message says what this rank knows).
/// Never throws.
void report_hang(std::string_view what, double gather_s);

/// Async-signal-safe: a stop signal (SIGTERM, SIGUSR1, SIGINT) arrived. A wait that stays
/// blocked kSignalWaitS seconds after it writes the ledger file and prints where it waits
/// (comm_detail::notice_stop_signal).
void note_stop_signal();
bool stop_signal_noted();
inline constexpr double kSignalWaitS = 0.5;

int64_t ledger_now_ns();

}  // namespace kiln

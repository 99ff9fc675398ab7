// Communicator: the one interface through which ranks exchange tensors.
//
// Shaped like PyTorch c10d's Backend and flashlight's communicator: every collective has
// an asynchronous form that returns a Work handle, and a blocking form that is the
// asynchronous one followed by wait(). Buffers are kiln Tensors (a device pointer plus a
// dtype) and every call takes a Stream, so that an NCCL implementation (which enqueues on
// a cudaStream_t) fits behind the same interface. The gradient-sync policy (buckets,
// DDP, ZeRO) lives elsewhere (src/parallel/) and only calls this interface.
//
// Implementations:
//   LocalCommunicator  world of one process: collectives are copies or no-ops.
//   SimulatedCommunicator  one rank of a world that does not exist (dry runs): calls are
//                      checked and recorded, no memory is touched. It and the local one
//                      share their checks, descriptions and statistics through
//                      InProcessCommunicator.
//   MpiCommunicator    MPI (built when KILN_MPI is ON). A communication thread starts the
//                      queued collectives in order as MPI non-blocking operations and
//                      drives their progress while the caller computes; Work handles
//                      complete from that thread. See mpi_communicator.cpp.
//
// Rules shared by every implementation:
// - All ranks of a communicator call the same collectives in the same order (as MPI and
//   NCCL require). Point-to-point send/recv are matched by (peer, tag).
// - Buffers must stay alive and untouched until the Work completes (a Tensor copy held
//   by the Work keeps owned storage alive; borrowed views are the caller's to keep).
// - dtypes: fp32, bf16, fp16, int32. Reductions of bf16/fp16 on the CPU convert to fp32,
//   reduce in fp32 and round back to 16 bits once (round to nearest even): the result is
//   the correctly rounded fp32 sum, never a chain of 16-bit roundings.
// - Failures never hang: every wait has a timeout (kDefaultCommTimeout, or set_timeout():
//   the trainer sets parallel.timeout_s); a wait that times out calls abort_all() naming
//   the collective and rank.
#pragma once

#include "backend/backend.h"
#include "core/tensor.h"
#include "core/trace_sink.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

class Ledger;
struct LedgerEntry;

enum class ReduceOp : uint8_t {
  Sum,
  Max,  // for agreeing on flags (found_inf, stop requested) across ranks
};
const char* reduce_op_name(ReduceOp op);

enum class Collective : uint8_t {
  AllReduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  Send,
  Recv,
  Barrier,
  AllToAll,
};
inline constexpr int kNumCollectives = 8;
/// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier",
/// "all_to_all".
const char* collective_name(Collective c);

/// Statistics of one kind of collective on one communicator.
///   bytes: the nccl-tests "size" of each call, summed: the buffer for all_reduce and
///          broadcast, the FULL buffer (size * n elements) for reduce_scatter and
///          all_gather, the message for send/recv, 0 for barrier, the bytes this rank
///          sends (its own piece included) for all_to_all.
///   seconds: time from the operation's start (on the communication thread) to its
///          completion, summed. Overlapping operations are each counted in full.
struct CollectiveStats {
  int64_t count = 0;
  int64_t bytes = 0;
  double seconds = 0.0;
};

struct CommStats {
  std::array<CollectiveStats, kNumCollectives> per{};
  const CollectiveStats& of(Collective c) const { return per[static_cast<int>(c)]; }
};

/// nccl-tests bus-bandwidth factor for a collective over n ranks
/// (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
///   all_reduce                 2 (n - 1) / n
///   reduce_scatter, all_gather,
///   all_to_all                 (n - 1) / n
///   broadcast, send, recv      1
///   barrier                    0
double bus_bandwidth_factor(Collective c, int n);
/// algbw = bytes / seconds;  busbw = algbw * bus_bandwidth_factor(c, n). Bytes per second.
double algorithm_bandwidth(int64_t bytes, double seconds);
double bus_bandwidth(Collective c, int n, int64_t bytes, double seconds);

/// A handle on an operation in flight.
class Work {
 public:
  virtual ~Work() = default;
  /// Blocks until the operation is done. When the communicator's timeout passes first,
  /// calls abort_all() with a message naming the collective, the communicator and the
  /// rank (the process exits; wait() never returns in that case).
  virtual void wait() = 0;
  /// Whether the operation is done (never blocks).
  virtual bool is_completed() const = 0;
  /// "all_reduce(sum, fp32[1024]) on 'world' (rank 1 of 4)"
  virtual std::string description() const = 0;
  /// What a timeout reports: the description, with the call site and the ranks missing
  /// where the implementation knows them.
  virtual std::string timeout_description() const { return description(); }
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "local" or "mpi".
  virtual std::string backend_name() const = 0;
  /// "world", or the name given to new_group().
  const std::string& name() const { return name_; }

  // ---- asynchronous forms ------------------------------------------------------------
  /// In place: t <- op over ranks of t; the same bits on every rank (an fp64 sum, e.g. a
  /// step's loss and gradient norm, is added in rank order on MPI; NCCL's reductions
  /// give every rank the same result).
  virtual std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum,
                                                 Stream s = {}) = 0;
  /// input [size() * n] -> output [n] = sum over ranks of input[rank() * n, (rank()+1) * n).
  virtual std::shared_ptr<Work> reduce_scatter_async(const Tensor& output, const Tensor& input,
                                                     Stream s = {}) = 0;
  /// input [n] -> output [size() * n], rank r's input at output[r * n, (r+1) * n).
  virtual std::shared_ptr<Work> all_gather_async(const Tensor& output, const Tensor& input,
                                                 Stream s = {}) = 0;
  /// In place: t <- root's t.
  virtual std::shared_ptr<Work> broadcast_async(const Tensor& t, int root, Stream s = {}) = 0;
  /// Point to point, matched by (peer, tag); tag in [0, 32767].
  virtual std::shared_ptr<Work> send_async(const Tensor& t, int peer, int tag, Stream s = {}) = 0;
  virtual std::shared_ptr<Work> recv_async(const Tensor& t, int peer, int tag, Stream s = {}) = 0;
  virtual std::shared_ptr<Work> barrier_async() = 0;
  /// Variable-count all-to-all (MPI_Alltoallv; NCCL: grouped sends and receives), as
  /// expert parallelism's token dispatch: `input` holds size() pieces one after the
  /// other, the piece for rank q send_counts[q] elements long; rank q's piece for this
  /// rank arrives in `output` as the q-th of size() consecutive pieces, recv_counts[q]
  /// long. Counts are elements (>= 0, 0 allowed), size() of each, host memory, copied
  /// before the call returns; recv_counts[q] must equal rank q's send_counts[rank()]
  /// (exchange them first, e.g. by an all_to_all of one int32 per rank), and
  /// send_counts[rank()] == recv_counts[rank()]. input and output have one dtype and do
  /// not overlap; elements past the pieces are neither sent nor written. Throws
  /// kiln::Error for bad counts or buffers.
  virtual std::shared_ptr<Work> all_to_all_async(const Tensor& output, const Tensor& input,
                                                 std::span<const int64_t> send_counts,
                                                 std::span<const int64_t> recv_counts,
                                                 Stream s = {}) = 0;
  /// Sends and receives posted between group_start() and group_end() are issued together
  /// (NCCL group calls: a send and a receive between the same two ranks cannot then
  /// deadlock on one stream). The default does nothing: MPI's are non-blocking already.
  virtual void group_start() {}
  virtual void group_end() {}

  // ---- blocking forms: the asynchronous form, then wait() ----------------------------
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum, Stream s = {}) {
    all_reduce_async(t, op, s)->wait();
  }
  void reduce_scatter(const Tensor& output, const Tensor& input, Stream s = {}) {
    reduce_scatter_async(output, input, s)->wait();
  }
  void all_gather(const Tensor& output, const Tensor& input, Stream s = {}) {
    all_gather_async(output, input, s)->wait();
  }
  void broadcast(const Tensor& t, int root, Stream s = {}) { broadcast_async(t, root, s)->wait(); }
  void send(const Tensor& t, int peer, int tag, Stream s = {}) { send_async(t, peer, tag, s)->wait(); }
  void recv(const Tensor& t, int peer, int tag, Stream s = {}) { recv_async(t, peer, tag, s)->wait(); }
  void barrier() { barrier_async()->wait(); }
  void all_to_all(const Tensor& output, const Tensor& input, std::span<const int64_t> send_counts,
                  std::span<const int64_t> recv_counts, Stream s = {}) {
    all_to_all_async(output, input, send_counts, recv_counts, s)->wait();
  }

  // ---- exact scalar reductions -------------------------------------------------------
  /// In place: values <- the sum over ranks of values (host memory, the same count on
  /// every rank; meant for a few scalars: token counts, loss sums). Built once, on
  /// all_gather of the raw 64-bit words (as int32 pairs), for every implementation: each
  /// rank adds the gathered values in rank order, so every rank gets the same result;
  /// int64 sums are exact (wrapping past 2^63), fp64 sums are the fp64 sum in rank order
  /// (no fp32 rounding, exact for integers below 2^53). Collective, blocking.
  void all_reduce_sum(std::span<int64_t> values);
  void all_reduce_sum(std::span<double> values);

  /// A communicator over `ranks` (ranks of THIS communicator, distinct, any order); the
  /// new communicator's rank i is ranks[i]. Called by exactly the ranks in `ranks` (every
  /// member, none else); a rank creating several groups creates them in the same order as
  /// the other members. Blocking. `name` defaults to "<parent>/group".
  std::unique_ptr<Communicator> new_group(const std::vector<int>& ranks, std::string name = {});
  /// A communicator per color, as MPI_Comm_split: called by EVERY rank of this
  /// communicator; ranks with the same color form a group, ordered by (key, rank).
  /// Blocking. `name` defaults to "<parent>/split".
  std::unique_ptr<Communicator> split(int color, int key, std::string name = {});

  // ---- timeouts and statistics -------------------------------------------------------
  /// Seconds a wait may take before abort_all(). Starts at kDefaultCommTimeout;
  /// sub-groups inherit their parent's value.
  double timeout() const { return timeout_s_; }
  void set_timeout(double seconds);

  CommStats stats() const;
  void reset_stats();

  /// Where each completed operation is reported for a trace (category "comm", on the
  /// virtual track "comm <name>"); nullptr (the default): nowhere. Not owned; install it
  /// before the operations to trace. Sub-groups (new_group, split) inherit their parent's.
  virtual void set_tracer(TraceSink* tracer) {
    tracer_.store(tracer, std::memory_order_relaxed);
  }
  TraceSink* tracer() const { return tracer_.load(std::memory_order_relaxed); }

  // ---- the collective ledger (comm/ledger.h) ----------------------------------------
  /// This communicator's ledger; null for the in-process communicators (nothing to
  /// diagnose across processes).
  const Ledger* ledger() const { return ledger_.get(); }
  /// The world rank of each member ([size()]): from the ledger, else 0..size()-1.
  std::vector<int> world_ranks() const;

 protected:
  explicit Communicator(std::string name);
  /// Starts the ledger (implementations that talk to other processes, once, at creation).
  void start_ledger(std::vector<int> world_ranks);
  /// Records a call being submitted in the ledger (the entry with its number); without a
  /// ledger an entry numbered 0.
  LedgerEntry note_call(Collective op, DType dtype, int64_t count, int peer);
  /// Marks a recorded call done (any thread).
  void note_done(const LedgerEntry& entry);
  virtual std::unique_ptr<Communicator> make_group(const std::vector<int>& ranks,
                                                   const std::string& name) = 0;
  virtual std::unique_ptr<Communicator> make_split(int color, int key,
                                                   const std::string& name) = 0;
  /// Called by implementations when an operation completes.
  void record(Collective c, int64_t bytes, double seconds);
  /// Checks shared by every implementation (throw kiln::Error with a clear message).
  void check_buffer(const Tensor& t, const char* what) const;
  void check_reduce_scatter(const Tensor& output, const Tensor& input) const;
  void check_all_gather(const Tensor& output, const Tensor& input) const;
  /// all_to_all's checks; returns the elements sent and received (the sums of the counts).
  std::pair<int64_t, int64_t> check_all_to_all(const Tensor& output, const Tensor& input,
                                               std::span<const int64_t> send_counts,
                                               std::span<const int64_t> recv_counts) const;
  void check_peer(int peer, int tag, const char* what) const;
  void check_root(int root) const;
  /// "'world' (rank 1 of 4)".
  std::string where() const;

 private:
  std::string name_;
  double timeout_s_;
  std::atomic<TraceSink*> tracer_{nullptr};
  std::shared_ptr<Ledger> ledger_;
  mutable std::mutex stats_mu_;
  CommStats stats_;
};

/// The communicator for every process of this job: MPI when mpirun or srun launched
/// several processes (and kiln was built with KILN_MPI), otherwise a LocalCommunicator of
/// size 1. comm/registry.h chooses others by name (parallel.communicator). The MPI world
/// communicator is created once per process (MPI cannot be initialised twice). See
/// docs/distributed.md.
std::unique_ptr<Communicator> make_world_communicator();

/// Whether this build has the MPI communicator.
bool comm_built_with_mpi();

/// The number of processes the launcher started, read from the environment
/// (OMPI_COMM_WORLD_SIZE, PMI_SIZE; PMIX_RANK alone means a PMIx launch of unknown
/// size, reported as -1; srun without a PMI: SLURM_STEP_NUM_TASKS, see below). 0 when
/// not launched by mpirun/srun.
int launcher_world_size();
/// The number of tasks srun started for this step when it gave them no process-management
/// interface (no --mpi and Slurm's MpiDefault=none: SLURM_STEP_NUM_TASKS > 1 and none of
/// the variables above), else 0. launcher_world_size() reports that number, so that an
/// error before MPI is said once (abort_all); the world communicator refuses such a launch.
int srun_tasks_without_pmi();
/// Throws kiln::Error when srun_tasks_without_pmi() > 0, naming srun --mpi=pmix: each task
/// would otherwise start MPI alone and train its own copy of the run.
void check_srun_has_pmi();
/// This process's rank among those of its node (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID,
/// MPI_LOCALRANKID); 0 when not launched or unknown.
int launcher_local_rank();

/// Seconds a wait may take on a new communicator (parallel.timeout_s's default); the
/// trainer sets parallel.timeout_s, and programs without a config call set_timeout().
inline constexpr double kDefaultCommTimeout = 60.0;

/// Prints "kiln: rank R: <message>" to stderr and ends every process of the job with a
/// non-zero status (MPI_Abort under MPI; exit(1) for a single process). R is the world
/// rank. Before the world communicator exists (the ranks have read only the same
/// arguments and config), only the launcher's rank 0 prints, and each rank exits 1.
/// Safe to call from any thread.
[[noreturn]] void abort_all(std::string_view message);

/// All ranks of `comm` compare `hash` (any string, e.g. a hex digest of the config);
/// when any rank's differs from rank 0's, every rank throws kiln::Error:
///   "<what> differs between ranks: rank 1 has <hash1>, rank 0 has <hash0>"
/// (what = "config" gives "config differs between ranks: ..."). Collective.
void check_same_on_all_ranks(Communicator& comm, const std::string& what, const std::string& hash);

}  // namespace kiln

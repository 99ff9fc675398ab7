// The parts of the communicator every implementation shares: checks, statistics,
// timeouts, abort_all, the config-hash check and the world factory.
#include "comm/communicator.h"

#include "comm/detail.h"
#include "comm/fault.h"
#include "comm/ledger.h"
#include "comm/local_communicator.h"
#ifdef KILN_HAVE_MPI
#include "comm/mpi_communicator.h"
#endif

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

namespace kiln {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllGather: return "all_gather";
    case Collective::Broadcast: return "broadcast";
    case Collective::Send: return "send";
    case Collective::Recv: return "recv";
    case Collective::Barrier: return "barrier";
    case Collective::AllToAll: return "all_to_all";
  }
  return "?";
}

double bus_bandwidth_factor(Collective c, int n) {
  if (n <= 0) return 0.0;
  switch (c) {
    case Collective::AllReduce: return 2.0 * (n - 1) / n;
    case Collective::ReduceScatter:
    case Collective::AllGather:
    case Collective::AllToAll: return static_cast<double>(n - 1) / n;
    case Collective::Broadcast:
    case Collective::Send:
    case Collective::Recv: return 1.0;
    case Collective::Barrier: return 0.0;
  }
  return 0.0;
}

double algorithm_bandwidth(int64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds : 0.0;
}

double bus_bandwidth(Collective c, int n, int64_t bytes, double seconds) {
  return algorithm_bandwidth(bytes, seconds) * bus_bandwidth_factor(c, n);
}

// ---- Communicator base --------------------------------------------------------------

Communicator::Communicator(std::string name)
    : name_(std::move(name)), timeout_s_(kDefaultCommTimeout) {}

Communicator::~Communicator() {
  if (ledger_) unregister_ledger(ledger_.get());
}

void Communicator::start_ledger(std::vector<int> world_ranks) {
  ledger_ = std::make_shared<Ledger>(name_, rank(), std::move(world_ranks));
  register_ledger(ledger_);
}

std::vector<int> Communicator::world_ranks() const {
  if (ledger_) return ledger_->world_ranks();
  std::vector<int> r(static_cast<size_t>(size()));
  for (int i = 0; i < size(); ++i) r[static_cast<size_t>(i)] = i;
  return r;
}

LedgerEntry Communicator::note_call(Collective op, DType dtype, int64_t count, int peer) {
  if (!ledger_) return LedgerEntry{};
  return ledger_->add(op, dtype, count, peer);
}

void Communicator::note_done(const LedgerEntry& entry) {
  if (ledger_ && entry.seq > 0) ledger_->done(entry.op, entry.seq, entry.peer);
}

void Communicator::set_timeout(double seconds) {
  KILN_CHECK(std::isfinite(seconds) && seconds > 0,
             "communicator '{}': timeout must be a positive number of seconds, got {}", name_,
             seconds);
  timeout_s_ = seconds;
}

CommStats Communicator::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void Communicator::reset_stats() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = CommStats{};
}

void Communicator::record(Collective c, int64_t bytes, double seconds) {
  if (TraceSink* t = tracer(); t != nullptr && t->enabled())
    t->record_collective_done(collective_name(c), bytes, seconds, "comm " + name());
  std::lock_guard<std::mutex> lock(stats_mu_);
  CollectiveStats& s = stats_.per[static_cast<int>(c)];
  s.count += 1;
  s.bytes += bytes;
  s.seconds += seconds;
}

std::string Communicator::where() const {
  return fmt::format("'{}' (rank {} of {})", name_, rank(), size());
}

std::unique_ptr<Communicator> Communicator::new_group(const std::vector<int>& ranks,
                                                     std::string name) {
  if (name.empty()) name = name_ + "/group";
  KILN_CHECK(!ranks.empty(), "new_group '{}' on {}: no ranks given", name, where());
  std::vector<bool> seen(static_cast<size_t>(size()), false);
  bool member = false;
  for (int r : ranks) {
    KILN_CHECK(r >= 0 && r < size(), "new_group '{}' on {}: rank {} out of range [0, {})", name,
               where(), r, size());
    KILN_CHECK(!seen[static_cast<size_t>(r)], "new_group '{}' on {}: rank {} listed twice", name,
               where(), r);
    seen[static_cast<size_t>(r)] = true;
    member = member || r == rank();
  }
  KILN_CHECK(member, "new_group '{}' on {}: called by rank {}, which is not in the group", name,
             where(), rank());
  auto group = make_group(ranks, name);
  group->set_timeout(timeout());
  group->set_tracer(tracer());
  return group;
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, std::string name) {
  if (name.empty()) name = name_ + "/split";
  KILN_CHECK(color >= 0, "split '{}' on {}: color must be >= 0, got {}", name, where(), color);
  auto group = make_split(color, key, name);
  group->set_timeout(timeout());
  group->set_tracer(tracer());
  return group;
}

void Communicator::check_buffer(const Tensor& t, const char* what) const {
  KILN_CHECK(t.raw() != nullptr || t.numel() == 0, "{} on {}: buffer is empty", what, where());
  DType d = t.dtype();
  KILN_CHECK(d == DType::F32 || d == DType::BF16 || d == DType::F16 || d == DType::I32 ||
                 d == DType::F64,
             "{} on {}: unsupported dtype {}", what, where(), dtype_name(d));
}

void Communicator::check_reduce_scatter(const Tensor& output, const Tensor& input) const {
  check_buffer(output, "reduce_scatter output");
  check_buffer(input, "reduce_scatter input");
  KILN_CHECK(output.dtype() == input.dtype(),
             "reduce_scatter on {}: input is {} but output is {}", where(),
             dtype_name(input.dtype()), dtype_name(output.dtype()));
  KILN_CHECK(input.numel() == output.numel() * size(),
             "reduce_scatter on {}: input has {} elements, expected size ({}) * output ({}) = {}",
             where(), input.numel(), size(), output.numel(), output.numel() * size());
}

void Communicator::check_all_gather(const Tensor& output, const Tensor& input) const {
  check_buffer(output, "all_gather output");
  check_buffer(input, "all_gather input");
  KILN_CHECK(output.dtype() == input.dtype(), "all_gather on {}: input is {} but output is {}",
             where(), dtype_name(input.dtype()), dtype_name(output.dtype()));
  KILN_CHECK(output.numel() == input.numel() * size(),
             "all_gather on {}: output has {} elements, expected size ({}) * input ({}) = {}",
             where(), output.numel(), size(), input.numel(), input.numel() * size());
}

std::pair<int64_t, int64_t> Communicator::check_all_to_all(
    const Tensor& output, const Tensor& input, std::span<const int64_t> send_counts,
    std::span<const int64_t> recv_counts) const {
  check_buffer(output, "all_to_all output");
  check_buffer(input, "all_to_all input");
  KILN_CHECK(output.dtype() == input.dtype(), "all_to_all on {}: input is {} but output is {}",
             where(), dtype_name(input.dtype()), dtype_name(output.dtype()));
  const auto n = static_cast<size_t>(size());
  KILN_CHECK(send_counts.size() == n && recv_counts.size() == n,
             "all_to_all on {}: {} send and {} receive counts, expected one per rank ({})",
             where(), send_counts.size(), recv_counts.size(), n);
  int64_t sent = 0, received = 0;
  for (size_t q = 0; q < n; ++q) {
    KILN_CHECK(send_counts[q] >= 0 && recv_counts[q] >= 0,
               "all_to_all on {}: negative count for rank {} (send {}, receive {})", where(), q,
               send_counts[q], recv_counts[q]);
    sent += send_counts[q];
    received += recv_counts[q];
  }
  const auto self = static_cast<size_t>(rank());
  KILN_CHECK(send_counts[self] == recv_counts[self],
             "all_to_all on {}: this rank sends itself {} elements but receives {} from itself",
             where(), send_counts[self], recv_counts[self]);
  KILN_CHECK(sent <= input.numel() && received <= output.numel(),
             "all_to_all on {}: the counts send {} and receive {} elements, but input has {} "
             "and output {}",
             where(), sent, received, input.numel(), output.numel());
  KILN_CHECK(!comm_detail::overlaps(input, output), "all_to_all on {}: input and output overlap",
             where());
  return {sent, received};
}

void Communicator::check_peer(int peer, int tag, const char* what) const {
  KILN_CHECK(peer >= 0 && peer < size(), "{} on {}: peer {} out of range [0, {})", what, where(),
             peer, size());
  KILN_CHECK(tag >= 0 && tag <= 32767, "{} on {}: tag {} out of range [0, 32767]", what, where(),
             tag);
}

void Communicator::check_root(int root) const {
  KILN_CHECK(root >= 0 && root < size(), "broadcast on {}: root {} out of range [0, {})", where(),
             root, size());
}

// ---- Work ---------------------------------------------------------------------------

namespace comm_detail {

BasicWork::BasicWork(std::string description, double timeout_s, std::function<void()> progress)
    : description_(std::move(description)), timeout_s_(timeout_s), progress_(std::move(progress)) {}

void BasicWork::complete() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void BasicWork::wait() {
  if (is_completed()) return;
  const auto t0 = Clock::now();
  const auto limit = std::chrono::duration<double>(timeout_s_);
  std::optional<Clock::time_point> signal_seen;  // when this wait first saw a stop signal
  if (progress_) {
    // No communication thread: this thread drives MPI's progress.
    int idle = 0;
    while (!is_completed()) {
      progress_();
      if (is_completed()) break;
      if (Clock::now() - t0 > limit) break;
      if ((idle & 1023) == 0) notice_stop_signal(signal_seen, *this);
      if (++idle < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  } else {
    // Wakes every 100 ms to notice a stop signal.
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_.load(std::memory_order_acquire) && Clock::now() - t0 < limit) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      notice_stop_signal(signal_seen, *this);
    }
  }
  if (!is_completed()) {
    const std::string what = timeout_description();
    report_hang(what, kLedgerGatherS);
    abort_all(fmt::format("timed out after {} s waiting for {} (parallel.timeout_s sets the "
                          "limit); another rank failed, exited, stopped or called a different "
                          "collective",
                          timeout_s_, what));
  }
}

void notice_stop_signal(std::optional<Clock::time_point>& seen, const Work& work) {
  if (!stop_signal_noted()) return;
  if (!seen) seen = Clock::now();
  if (seconds_since(*seen) < kSignalWaitS) return;
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  // Under a launcher that kills the job (a rank died, or the user stopped it), the ranks
  // may not live until the timeout: say now where this one waits.
  const std::string what = work.timeout_description();
  const std::string path = write_ledger_file("stop signal while waiting for " + what);
  std::fprintf(stderr, "kiln: rank %d: a stop signal arrived while this rank waits for %s%s%s\n",
               world_rank(), what.c_str(), path.empty() ? "" : "; ledger: ", path.c_str());
  std::fflush(stderr);
}

std::string BasicWork::timeout_description() const {
  const std::string detail = detail_ ? detail_() : std::string();
  return detail.empty() ? description_ : description_ + ": " + detail;
}

std::shared_ptr<Work> completed_work(std::string description) {
  auto w = std::make_shared<BasicWork>(std::move(description), 1.0);
  w->complete();
  return w;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  auto pa = reinterpret_cast<uintptr_t>(a.raw());
  auto pb = reinterpret_cast<uintptr_t>(b.raw());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes() && a.nbytes() > 0 && b.nbytes() > 0;
}

std::string describe(Collective c, const Tensor& t, const std::string& extra) {
  std::string shape = fmt::format("{}[{}]", dtype_name(t.dtype()), t.numel());
  if (extra.empty()) return fmt::format("{}({})", collective_name(c), shape);
  return fmt::format("{}({}, {})", collective_name(c), extra, shape);
}

namespace {
std::atomic<int> g_world_rank{-1};  // -1: no world communicator yet
std::atomic<AbortHook> g_abort_hook{nullptr};
std::atomic<bool> g_aborting{false};
}  // namespace

void set_world_rank(int rank) { g_world_rank.store(rank); }
int world_rank() {
  const int r = g_world_rank.load();
  if (r >= 0) return r;
  // Before MPI is up, the launcher's environment still names this process's rank.
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}
void set_abort_hook(AbortHook hook) { g_abort_hook.store(hook); }

}  // namespace comm_detail

[[noreturn]] void abort_all(std::string_view message) {
  using namespace comm_detail;
  std::fflush(stdout);
  // Before the world communicator exists every rank has read the same inputs (the
  // arguments, the config) and failed alike: rank 0 says it once, the others end quietly,
  // and the launcher prints one short notice of a non-zero exit.
  const bool before_world = g_world_rank.load() < 0;
  if (!before_world || world_rank() == 0)
    std::fprintf(stderr, "kiln: rank %d: %.*s\n", world_rank(), static_cast<int>(message.size()),
                 message.data());
  std::fflush(stderr);
  if (before_world) std::_Exit(1);
  write_ledger_file(message);  // a failing rank's ledger, for the diagnosis (ledger.h)
  if (g_aborting.exchange(true)) {
    // Another thread is already ending the job; give it time, then leave regardless.
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(1);
  }
  if (AbortHook hook = g_abort_hook.load()) hook(1);
  std::_Exit(1);
}

// ---- the launcher's environment -------------------------------------------------------

namespace {
int env_int(const char* name) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  long v = std::strtol(env, &end, 10);
  KILN_CHECK(end != env && *end == '\0' && v > 0, "{} must be a positive integer, got '{}'", name,
             env);
  return static_cast<int>(v);
}
}  // namespace

int launcher_world_size() {
  if (int n = env_int("OMPI_COMM_WORLD_SIZE")) return n;  // Open MPI's mpirun
  if (int n = env_int("PMI_SIZE")) return n;              // MPICH/Hydra, srun --mpi=pmi2
  if (std::getenv("PMIX_RANK") != nullptr) return -1;     // srun --mpi=pmix, prte
  return srun_tasks_without_pmi();
}

int srun_tasks_without_pmi() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK"))
    return 0;
  // srun sets SLURM_STEP_NUM_TASKS for the tasks of a step; a batch script (SLURM_NTASKS
  // of the whole allocation) runs one process and has none.
  const int n = env_int("SLURM_STEP_NUM_TASKS");
  return n > 1 ? n : 0;
}

void check_srun_has_pmi() {
  const int n = srun_tasks_without_pmi();
  KILN_CHECK(n == 0,
             "srun started {} tasks without a process-management interface (Slurm's MpiDefault "
             "is none), so each would train alone: launch with srun --mpi=pmix (or set "
             "MpiDefault=pmix in slurm.conf; docs/distributed.md, \"Slurm\")",
             n);
}

int launcher_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    const char* env = std::getenv(name);
    if (env == nullptr || *env == '\0') continue;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    KILN_CHECK(end != env && *end == '\0' && v >= 0, "{} must be a rank >= 0, got '{}'", name, env);
    return static_cast<int>(v);
  }
  return 0;
}

bool comm_built_with_mpi() {
#ifdef KILN_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> make_world_communicator() {
  check_srun_has_pmi();
  const int launched = launcher_world_size();
  if (launched == 0 || launched == 1) {
    check_comm_fault(1);
    return std::make_unique<LocalCommunicator>("world");
  }
#ifdef KILN_HAVE_MPI
  auto world = make_mpi_world_communicator();
  check_comm_fault(world->size());
  return world;
#else
  KILN_FAIL(
      "launched by mpirun/srun with {} processes, but kiln was built without MPI "
      "(configure with -DKILN_MPI=ON, or run a single process)",
      launched < 0 ? std::string("several") : std::to_string(launched));
#endif
}

// ---- consistency check ---------------------------------------------------------------

namespace {
// Sums 64-bit scalars over the ranks of `comm` via all_gather of their raw words, adding
// in rank order (the same order, hence the same result, on every rank).
template <class T>
void sum_words_in_rank_order(Communicator& comm, std::span<T> values) {
  static_assert(sizeof(T) == 8);
  const auto n = static_cast<int64_t>(values.size());
  if (comm.size() == 1 || n == 0) return;
  std::vector<int32_t> mine(static_cast<size_t>(2 * n)), all(static_cast<size_t>(2 * n * comm.size()));
  std::memcpy(mine.data(), values.data(), values.size_bytes());
  // Every slot starts as this rank's values, so a communicator that moves no data (the
  // simulated one of dry runs) yields size() x values rather than garbage.
  for (int r = 0; r < comm.size(); ++r)
    std::memcpy(all.data() + 2 * n * r, mine.data(), values.size_bytes());
  comm.all_gather(Tensor::view(all.data(), {2 * n * comm.size()}, DType::I32),
                  Tensor::view(mine.data(), {2 * n}, DType::I32));
  for (int64_t i = 0; i < n; ++i) {
    T sum{};
    for (int r = 0; r < comm.size(); ++r) {
      T v;
      std::memcpy(&v, all.data() + 2 * (static_cast<int64_t>(r) * n + i), sizeof(T));
      if constexpr (std::is_integral_v<T>)  // wrap around instead of overflowing
        sum = static_cast<T>(static_cast<uint64_t>(sum) + static_cast<uint64_t>(v));
      else
        sum += v;
    }
    values[static_cast<size_t>(i)] = sum;
  }
}
}  // namespace

void Communicator::all_reduce_sum(std::span<int64_t> values) { sum_words_in_rank_order(*this, values); }
void Communicator::all_reduce_sum(std::span<double> values) { sum_words_in_rank_order(*this, values); }

void check_same_on_all_ranks(Communicator& comm, const std::string& what, const std::string& hash) {
  KILN_CHECK(hash.size() < (1u << 30), "check_same_on_all_ranks({}): hash too long", what);
  // Agree on a length, then gather [length, bytes...] packed into int32 words.
  int32_t len = static_cast<int32_t>(hash.size());
  int32_t max_len = len;
  comm.all_reduce(Tensor::view(&max_len, {1}, DType::I32), ReduceOp::Max);
  const int64_t words = 1 + (static_cast<int64_t>(max_len) + 3) / 4;
  std::vector<int32_t> mine(static_cast<size_t>(words), 0);
  mine[0] = len;
  std::memcpy(mine.data() + 1, hash.data(), hash.size());
  std::vector<int32_t> all(static_cast<size_t>(words * comm.size()), 0);
  comm.all_gather(Tensor::view(all.data(), {words * comm.size()}, DType::I32),
                  Tensor::view(mine.data(), {words}, DType::I32));
  auto decode = [&](int r) {
    const int32_t* p = all.data() + r * words;
    std::string s(static_cast<size_t>(p[0]), '\0');
    std::memcpy(s.data(), p + 1, s.size());
    return s;
  };
  auto shown = [](const std::string& s) {
    return s.size() <= 80 ? "'" + s + "'" : "'" + s.substr(0, 77) + "...'";
  };
  const std::string h0 = decode(0);
  for (int r = 1; r < comm.size(); ++r) {
    std::string hr = decode(r);
    if (hr != h0) {
      KILN_FAIL("{} differs between ranks: rank {} has {}, rank 0 has {}", what, r, shown(hr),
                shown(h0));
    }
  }
}

}  // namespace kiln

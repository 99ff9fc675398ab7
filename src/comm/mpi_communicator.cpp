// MpiCommunicator: collectives over MPI, progressed by a communication thread.
// With mpi_engine.h and mpi_arrivals.h, the only files of kiln that include mpi.h.
// Design notes: mpi_communicator.h.
#include "comm/mpi_communicator.h"

#include "comm/detail.h"
#include "comm/fault.h"
#include "comm/ledger.h"
#include "comm/mpi_arrivals.h"
#include "comm/mpi_engine.h"

#include <mpi.h>

#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <thread>

namespace kiln {
namespace {

using comm_detail::BasicWork;
using comm_detail::Clock;
using comm_detail::describe;
using comm_detail::overlaps;
using comm_detail::seconds_since;
using comm_detail::Arrivals;
using comm_detail::Engine;
using comm_detail::mpi_check;
using comm_detail::mpi_error_string;
using comm_detail::Op;

enum class Mode { Multiple, Serialized, Inline };

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Multiple: return "multiple";
    case Mode::Serialized: return "serialized";
    case Mode::Inline: return "inline";
  }
  return "?";
}

bool is_16bit_float(DType d) { return d == DType::BF16 || d == DType::F16; }

/// How a dtype travels on the wire (16-bit floats as raw 16-bit words).
MPI_Datatype wire_type(DType d) {
  switch (d) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT32_T;
    case DType::F64: return MPI_DOUBLE;
    case DType::E4M3:
    case DType::E5M2: return MPI_UINT8_T;  // moved, never reduced
  }
  return MPI_BYTE;
}


void on_terminate() {
  std::string message = "terminate called without an active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      message = std::string("uncaught exception: ") + ex.what();
    } catch (...) {
      message = "uncaught exception of unknown type";
    }
  }
  abort_all(message);
}

void mpi_abort_hook(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

/// Process-wide MPI state; MPI_Finalize runs when the last communicator is gone.
class Runtime {
 public:
  static std::shared_ptr<Runtime> acquire();
  ~Runtime() {
    shared_engine_.reset();
    comm_detail::set_abort_hook(nullptr);
    int finalized = 0;
    MPI_Finalized(&finalized);
    // While an exception unwinds (a rank failing), MPI_Finalize would wait for the other
    // ranks, which are blocked in a collective waiting for this one: skip it, so the
    // error reaches the top level, which calls abort_all() and ends every rank.
    if (owns_ && !finalized && std::uncaught_exceptions() == 0) MPI_Finalize();
  }

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  /// The engine a new communicator uses: its own thread (MULTIPLE), or the one shared
  /// thread (SERIALIZED), or the shared inline engine.
  std::shared_ptr<Engine> engine_for_new_communicator() {
    if (mode_ == Mode::Multiple) return std::make_shared<Engine>(true);
    std::lock_guard<std::mutex> lock(mu_);
    if (!shared_engine_) shared_engine_ = std::make_shared<Engine>(mode_ == Mode::Serialized);
    return shared_engine_;
  }

 private:
  Runtime() = default;
  bool owns_ = false;
  Mode mode_ = Mode::Inline;
  int world_rank_ = 0;
  int world_size_ = 1;
  std::mutex mu_;
  std::shared_ptr<Engine> shared_engine_;
};

std::mutex g_runtime_mu;
std::weak_ptr<Runtime> g_runtime;

std::shared_ptr<Runtime> Runtime::acquire() {
  std::lock_guard<std::mutex> lock(g_runtime_mu);
  if (auto rt = g_runtime.lock()) return rt;
  int finalized = 0;
  MPI_Finalized(&finalized);
  KILN_CHECK(!finalized,
             "MPI has already been finalized: create the world communicator once per process and "
             "keep it until the end");
  std::shared_ptr<Runtime> rt(new Runtime());
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    KILN_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: {}", mpi_error_string(rc));
    rt->owns_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rt->world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &rt->world_size_);
  comm_detail::set_world_rank(rt->world_rank_);
  comm_detail::set_abort_hook(&mpi_abort_hook);
  std::set_terminate(&on_terminate);

  rt->mode_ = provided >= MPI_THREAD_MULTIPLE     ? Mode::Multiple
              : provided >= MPI_THREAD_SERIALIZED ? Mode::Serialized
                                                  : Mode::Inline;
  if (const char* env = std::getenv("KILN_MPI_THREADS"); env != nullptr && *env != '\0') {
    std::string want = env;
    Mode m;
    if (want == "multiple") {
      m = Mode::Multiple;
    } else if (want == "serialized") {
      m = Mode::Serialized;
    } else if (want == "inline") {
      m = Mode::Inline;
    } else {
      abort_all(fmt::format("KILN_MPI_THREADS must be multiple, serialized or inline, got '{}'", want));
    }
    if (static_cast<int>(m) < static_cast<int>(rt->mode_)) {
      abort_all(fmt::format("KILN_MPI_THREADS={}, but MPI provides only {}", want, mode_name(rt->mode_)));
    }
    rt->mode_ = m;
  }
  g_runtime = rt;
  return rt;
}

int checked_count(const Tensor& t, const char* what) {
  KILN_CHECK(t.numel() <= INT_MAX, "{}: {} elements exceed MPI's int count limit", what, t.numel());
  return static_cast<int>(t.numel());
}

Tensor scratch(DType dtype, int64_t n) {
  return Tensor::empty(host_allocator(), {std::max<int64_t>(n, 1)}, dtype, MemCategory::CommBuffers);
}

/// counts (whose sum fits an int) as ints, then each piece's displacement: the pieces lie
/// one after the other.
void append_counts_and_displacements(std::vector<int>& out, std::span<const int64_t> counts) {
  for (int64_t c : counts) out.push_back(static_cast<int>(c));
  int displacement = 0;
  for (int64_t c : counts) {
    out.push_back(displacement);
    displacement += static_cast<int>(c);
  }
}

/// A stable tag for MPI_Comm_create_group, derived from the member list.
int group_tag(const std::vector<int>& ranks) {
  uint32_t h = 2166136261u;
  for (int r : ranks) h = (h ^ static_cast<uint32_t>(r)) * 16777619u;
  return static_cast<int>(h % 32768u);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::shared_ptr<Runtime> rt, MPI_Comm comm, bool owns_comm, std::string name,
                  int rank, int size)
      : Communicator(std::move(name)),
        rt_(std::move(rt)),
        engine_(rt_->engine_for_new_communicator()),
        comm_(comm),
        owns_comm_(owns_comm),
        rank_(rank),
        size_(size) {
    // The ledger (ledger.h) and the arrival record (mpi_arrivals.h), so that a timeout
    // names the ranks that never came and where they are; not for the transient bootstrap
    // wrapper of MPI_COMM_WORLD.
    if (owns_comm_ && size_ > 1) {
      std::vector<int> world(static_cast<size_t>(size_));
      run_control([&] { world_ranks_of(comm_, world); }, "MPI_Group_translate_ranks on " + where());
      start_ledger(world);
      if (size_ <= Arrivals::kMaxRanks) {
        std::shared_ptr<Arrivals> a;
        run_control([&] { a = std::make_shared<Arrivals>(comm_, rank_, world, this->name()); },
                    "MPI_Comm_dup (arrival record) on " + where());
        arrivals_ = a;
        engine_->add_poller(this, [a] { a->poll(); });
      }
    }
  }

  ~MpiCommunicator() override {
    // Operations in flight still reference this communicator (statistics) and its MPI_Comm.
    const auto t0 = Clock::now();
    while (outstanding_.load() > 0) {
      if (!engine_->threaded()) engine_->progress();
      if (seconds_since(t0) > timeout()) {
        abort_all(fmt::format("timed out after {} s destroying communicator {} with {} operations "
                              "still in flight",
                              timeout(), where(), outstanding_.load()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (arrivals_) {
      engine_->remove_poller(this);
      std::shared_ptr<Arrivals> a = arrivals_;
      run_control([a] { a->close(); }, "closing the arrival record on " + where());
    }
    if (owns_comm_) {
      MPI_Comm c = comm_;
      run_control([c]() mutable { MPI_Comm_free(&c); }, "MPI_Comm_free on " + where());
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "mpi"; }

  std::shared_ptr<Work> all_reduce_async(const Tensor& given, ReduceOp op, Stream) override {
    // KILN_COMM_FAULT=count (fault.h): one element fewer.
    const Tensor t = comm_fault_now(CommFault::Count) && given.numel() > 0
                         ? given.view_at(0, Shape{given.numel() - 1})
                         : given;
    check_buffer(t, "all_reduce");
    check_host(t, "all_reduce");
    const int n = checked_count(t, "all_reduce");
    const MPI_Op mop = op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
    const MPI_Comm comm = comm_;
    std::string desc = describe(Collective::AllReduce, t, reduce_op_name(op)) + " on " + where();
    auto o = make_op(Collective::AllReduce, static_cast<int64_t>(t.nbytes()), desc, t.dtype(), n);
    if (is_16bit_float(t.dtype())) {
      // Reduce in fp32: convert, reduce, round back once.
      Tensor f = scratch(DType::F32, n);
      o->start = [t, f, n, mop, comm, desc](MPI_Request* r) {
        convert(t.raw(), t.dtype(), f.raw(), DType::F32, static_cast<size_t>(n));
        mpi_check(MPI_Iallreduce(MPI_IN_PLACE, f.raw(), n, MPI_FLOAT, mop, comm, r), "MPI_Iallreduce", desc);
      };
      o->finish = [t, f, n](const MPI_Status&) {
        convert(f.raw(), DType::F32, t.raw(), t.dtype(), static_cast<size_t>(n));
      };
    } else if (t.dtype() == DType::F64 && op == ReduceOp::Sum) {
      // A step's statistics (loss and gradient sums): gathered and added in rank order,
      // so that every rank gets the same bits (MPI_SUM's order is the library's).
      Tensor all = scratch(DType::F64, int64_t{n} * size_);
      const int ranks = size_;
      o->start = [t, all, n, comm, desc](MPI_Request* r) {
        mpi_check(MPI_Iallgather(t.raw(), n, MPI_DOUBLE, all.raw(), n, MPI_DOUBLE, comm, r),
                  "MPI_Iallgather", desc);
      };
      o->finish = [t, all, n, ranks](const MPI_Status&) {
        const auto* v = all.data<double>();
        auto* out = t.data<double>();
        for (int i = 0; i < n; ++i) {
          double sum = 0.0;
          for (int q = 0; q < ranks; ++q) sum += v[static_cast<size_t>(q) * n + i];
          out[i] = sum;
        }
      };
    } else {
      o->start = [t, n, mop, comm, desc](MPI_Request* r) {
        mpi_check(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), n, wire_type(t.dtype()), mop, comm, r),
                  "MPI_Iallreduce", desc);
      };
    }
    return submit(std::move(o));
  }

  std::shared_ptr<Work> reduce_scatter_async(const Tensor& output, const Tensor& input,
                                             Stream) override {
    check_reduce_scatter(output, input);
    check_host(output, "reduce_scatter");
    check_host(input, "reduce_scatter");
    checked_count(input, "reduce_scatter");
    const int n = checked_count(output, "reduce_scatter");
    const int64_t total = input.numel();
    const MPI_Comm comm = comm_;
    std::string desc = describe(Collective::ReduceScatter, input, "sum") + " on " + where();
    auto o = make_op(Collective::ReduceScatter, static_cast<int64_t>(input.nbytes()), desc,
                     input.dtype(), total);
    if (is_16bit_float(input.dtype())) {
      Tensor fin = scratch(DType::F32, total);
      Tensor fout = scratch(DType::F32, n);
      o->start = [input, fin, fout, n, total, comm, desc](MPI_Request* r) {
        convert(input.raw(), input.dtype(), fin.raw(), DType::F32, static_cast<size_t>(total));
        mpi_check(MPI_Ireduce_scatter_block(fin.raw(), fout.raw(), n, MPI_FLOAT, MPI_SUM, comm, r),
                  "MPI_Ireduce_scatter_block", desc);
      };
      o->finish = [output, fout, n](const MPI_Status&) {
        convert(fout.raw(), DType::F32, output.raw(), output.dtype(), static_cast<size_t>(n));
      };
    } else {
      // MPI forbids overlapping send and receive buffers: stage the input when they do.
      Tensor staged = overlaps(output, input) ? scratch(input.dtype(), total) : Tensor();
      o->start = [input, output, staged, n, comm, desc](MPI_Request* r) {
        const void* src = input.raw();
        if (staged) {
          std::memcpy(staged.raw(), input.raw(), input.nbytes());
          src = staged.raw();
        }
        mpi_check(MPI_Ireduce_scatter_block(src, output.raw(), n, wire_type(input.dtype()), MPI_SUM,
                                            comm, r),
                  "MPI_Ireduce_scatter_block", desc);
      };
    }
    return submit(std::move(o));
  }

  std::shared_ptr<Work> all_gather_async(const Tensor& output, const Tensor& input, Stream) override {
    check_all_gather(output, input);
    check_host(output, "all_gather");
    check_host(input, "all_gather");
    checked_count(output, "all_gather");
    const int n = checked_count(input, "all_gather");
    const MPI_Comm comm = comm_;
    const MPI_Datatype type = wire_type(input.dtype());
    std::string desc = describe(Collective::AllGather, output) + " on " + where();
    auto o = make_op(Collective::AllGather, static_cast<int64_t>(output.nbytes()), desc,
                     output.dtype(), output.numel());
    const bool in_place = input.raw() == static_cast<char*>(output.raw()) + input.nbytes() * rank_ &&
                          input.nbytes() > 0;
    Tensor staged = !in_place && overlaps(output, input) ? scratch(input.dtype(), n) : Tensor();
    o->start = [input, output, staged, in_place, n, type, comm, desc](MPI_Request* r) {
      const void* src = in_place ? MPI_IN_PLACE : input.raw();
      if (staged) {
        std::memcpy(staged.raw(), input.raw(), input.nbytes());
        src = staged.raw();
      }
      mpi_check(MPI_Iallgather(src, n, type, output.raw(), n, type, comm, r), "MPI_Iallgather", desc);
    };
    return submit(std::move(o));
  }

  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root, Stream) override {
    check_buffer(t, "broadcast");
    check_host(t, "broadcast");
    check_root(root);
    const int n = checked_count(t, "broadcast");
    const MPI_Comm comm = comm_;
    std::string desc =
        describe(Collective::Broadcast, t, fmt::format("root {}", root)) + " on " + where();
    auto o = make_op(Collective::Broadcast, static_cast<int64_t>(t.nbytes()), desc, t.dtype(), n, root);
    o->start = [t, n, root, comm, desc](MPI_Request* r) {
      mpi_check(MPI_Ibcast(t.raw(), n, wire_type(t.dtype()), root, comm, r), "MPI_Ibcast", desc);
    };
    return submit(std::move(o));
  }

  std::shared_ptr<Work> send_async(const Tensor& t, int peer, int tag, Stream) override {
    check_buffer(t, "send");
    check_host(t, "send");
    check_peer(peer, tag, "send");
    const int n = checked_count(t, "send");
    const MPI_Comm comm = comm_;
    std::string desc =
        describe(Collective::Send, t, fmt::format("to {}, tag {}", peer, tag)) + " on " + where();
    auto o = make_op(Collective::Send, static_cast<int64_t>(t.nbytes()), desc, t.dtype(), n, peer);
    o->start = [t, n, peer, tag, comm, desc](MPI_Request* r) {
      mpi_check(MPI_Isend(t.raw(), n, wire_type(t.dtype()), peer, tag, comm, r), "MPI_Isend", desc);
    };
    return submit(std::move(o));
  }

  std::shared_ptr<Work> recv_async(const Tensor& t, int peer, int tag, Stream) override {
    check_buffer(t, "recv");
    check_host(t, "recv");
    check_peer(peer, tag, "recv");
    const int n = checked_count(t, "recv");
    const MPI_Comm comm = comm_;
    std::string desc =
        describe(Collective::Recv, t, fmt::format("from {}, tag {}", peer, tag)) + " on " + where();
    auto o = make_op(Collective::Recv, static_cast<int64_t>(t.nbytes()), desc, t.dtype(), n, peer);
    o->start = [t, n, peer, tag, comm, desc](MPI_Request* r) {
      mpi_check(MPI_Irecv(t.raw(), n, wire_type(t.dtype()), peer, tag, comm, r), "MPI_Irecv", desc);
    };
    o->finish = [t, n, desc](const MPI_Status& status) {
      int got = 0;
      MPI_Get_count(&status, wire_type(t.dtype()), &got);
      if (got != n) abort_all(fmt::format("{}: expected {} elements, received {}", desc, n, got));
    };
    return submit(std::move(o));
  }

  std::shared_ptr<Work> barrier_async() override {
    const MPI_Comm comm = comm_;
    std::string desc = "barrier on " + where();
    auto o = make_op(Collective::Barrier, 0, desc);
    o->start = [comm, desc](MPI_Request* r) { mpi_check(MPI_Ibarrier(comm, r), "MPI_Ibarrier", desc); };
    return submit(std::move(o));
  }

  std::shared_ptr<Work> all_to_all_async(const Tensor& output, const Tensor& input,
                                         std::span<const int64_t> send_counts,
                                         std::span<const int64_t> recv_counts, Stream) override {
    const auto [sent, received] = check_all_to_all(output, input, send_counts, recv_counts);
    check_host(output, "all_to_all");
    check_host(input, "all_to_all");
    std::string desc =
        describe(Collective::AllToAll, input.view_at(0, Shape{sent})) + " on " + where();
    KILN_CHECK(sent <= INT_MAX && received <= INT_MAX,
               "{}: {} elements sent, {} received: beyond MPI's int count limit", desc, sent,
               received);
    // MPI_Alltoallv's int counts and displacements: send counts, send displacements,
    // receive counts, receive displacements, size() each.
    auto layout = std::make_shared<std::vector<int>>();
    append_counts_and_displacements(*layout, send_counts);
    append_counts_and_displacements(*layout, recv_counts);
    const int n = size_;
    const MPI_Comm comm = comm_;
    const MPI_Datatype type = wire_type(input.dtype());
    auto o = make_op(Collective::AllToAll, sent * static_cast<int64_t>(dtype_size(input.dtype())),
                     desc, input.dtype(), sent);
    o->start = [input, output, layout, n, type, comm, desc](MPI_Request* r) {
      const int* v = layout->data();
      mpi_check(MPI_Ialltoallv(input.raw(), v, v + n, type, output.raw(), v + 2 * n, v + 3 * n,
                               type, comm, r),
                "MPI_Ialltoallv", desc);
    };
    return submit(std::move(o));
  }

 protected:
  std::unique_ptr<Communicator> make_group(const std::vector<int>& ranks,
                                           const std::string& name) override {
    MPI_Comm parent = comm_;
    MPI_Comm created = MPI_COMM_NULL;
    int rank = -1, size = 0;
    const int tag = group_tag(ranks);
    std::string desc = fmt::format("new_group '{}' ({} ranks) on {}", name, ranks.size(), where());
    run_control(
        [&] {
          MPI_Group all, sub;
          mpi_check(MPI_Comm_group(parent, &all), "MPI_Comm_group", desc);
          mpi_check(MPI_Group_incl(all, static_cast<int>(ranks.size()), ranks.data(), &sub),
                    "MPI_Group_incl", desc);
          mpi_check(MPI_Comm_create_group(parent, sub, tag, &created), "MPI_Comm_create_group", desc);
          MPI_Group_free(&sub);
          MPI_Group_free(&all);
          finish_new_comm(created, &rank, &size, desc);
        },
        desc);
    return std::make_unique<MpiCommunicator>(rt_, created, true, name, rank, size);
  }

  std::unique_ptr<Communicator> make_split(int color, int key, const std::string& name) override {
    MPI_Comm parent = comm_;
    MPI_Comm created = MPI_COMM_NULL;
    int rank = -1, size = 0;
    std::string desc = fmt::format("split '{}' (color {}, key {}) on {}", name, color, key, where());
    run_control(
        [&] {
          mpi_check(MPI_Comm_split(parent, color, key, &created), "MPI_Comm_split", desc);
          finish_new_comm(created, &rank, &size, desc);
        },
        desc);
    return std::make_unique<MpiCommunicator>(rt_, created, true, name, rank, size);
  }

 private:
  static void finish_new_comm(MPI_Comm c, int* rank, int* size, const std::string& desc) {
    if (c == MPI_COMM_NULL) abort_all(desc + ": MPI returned no communicator");
    mpi_check(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", desc);
    MPI_Comm_rank(c, rank);
    MPI_Comm_size(c, size);
  }

  void check_host(const Tensor& t, const char* what) const {
    KILN_CHECK(t.device().is_cpu(),
               "{} on {}: the MPI communicator needs host tensors, got {} (device tensors need "
               "the NCCL communicator)",
               what, where(), t.str());
  }

  /// An operation on `buffer` (its dtype and `count` elements go to the ledger; `peer`: the
  /// other rank of send/recv, broadcast's root, else -1).
  std::unique_ptr<Op> make_op(Collective kind, int64_t bytes, const std::string& desc,
                              DType dtype = DType::F32, int64_t count = 0, int peer = -1) {
    auto o = std::make_unique<Op>();
    o->dtype = dtype;
    o->count = count;
    o->peer = peer;
    o->kind = kind;
    o->bytes = bytes;
    o->timeout_s = timeout();
    std::function<void()> progress;
    if (!engine_->threaded()) {
      std::shared_ptr<Engine> e = engine_;
      progress = [e] { e->progress(); };
    }
    o->work = std::make_shared<BasicWork>(desc, timeout(), std::move(progress));
    o->record = [this](Collective c, int64_t b, double s) { record(c, b, s); };
    o->done = [this] { outstanding_.fetch_sub(1); };
    return o;
  }

  std::shared_ptr<Work> submit(std::unique_ptr<Op> o) {
    if (!o->control) {
      if (apply_comm_faults(timeout())) return comm_detail::completed_work(o->work->description());
      record_in_ledger(*o);
    }
    std::shared_ptr<Work> w = o->work;
    outstanding_.fetch_add(1);
    engine_->submit(std::move(o));
    return w;
  }

  /// Records `o` in the ledger, names its call site in its timeout message, and, for a
  /// collective with an arrival record, announces it where (and when) it starts.
  void record_in_ledger(Op& o) {
    const LedgerEntry entry = note_call(o.kind, o.dtype, o.count, o.peer);
    const bool collective = o.kind != Collective::Send && o.kind != Collective::Recv;
    std::shared_ptr<Arrivals> a = collective ? arrivals_ : nullptr;
    if (a) {
      o.start = [a, ann = comm_detail::announcement_of(entry), inner = std::move(o.start)](MPI_Request* r) {
        a->announce(ann);
        inner(r);
      };
    }
    // Built only when a timeout asks (formatting it per call would cost every call).
    o.work->set_timeout_detail([this, a, entry, collective] {
      std::string detail = entry.site[0] != '\0' ? "at " + describe_site(entry.site) : std::string();
      auto add = [&](const std::string& part) { detail += (detail.empty() ? "" : "; ") + part; };
      if (!collective) add(fmt::format("peer: world rank {}", world_ranks()[static_cast<size_t>(entry.peer)]));
      if (a) add(a->missing(entry.seq));
      return detail;
    });
    o.done = [this, entry, inner = std::move(o.done)] {
      note_done(entry);
      inner();
    };
  }

  /// The world rank of each rank of `c` (local MPI calls).
  static void world_ranks_of(MPI_Comm c, std::vector<int>& world) {
    MPI_Group group, world_group;
    MPI_Comm_group(c, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    std::vector<int> mine(world.size());
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<int>(i);
    MPI_Group_translate_ranks(group, static_cast<int>(mine.size()), mine.data(), world_group, world.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
  }

  /// Runs `fn` (blocking MPI calls such as MPI_Comm_split) where this communicator's MPI
  /// calls run, and waits for it.
  void run_control(std::function<void()> fn, const std::string& desc) {
    auto o = make_op(Collective::Barrier, 0, desc);
    o->control = true;
    o->start = [fn = std::move(fn)](MPI_Request* r) {
      fn();
      *r = MPI_REQUEST_NULL;
    };
    submit(std::move(o))->wait();
  }

  std::shared_ptr<Runtime> rt_;  // first: MPI outlives the engine and the communicator
  std::shared_ptr<Engine> engine_;
  MPI_Comm comm_;
  bool owns_comm_;
  int rank_;
  int size_;
  std::atomic<int> outstanding_{0};
  std::shared_ptr<Arrivals> arrivals_;  // null: not kept (one rank, bootstrap, > kMaxRanks)
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world_communicator() {
  std::shared_ptr<Runtime> rt = Runtime::acquire();
  const int rank = rt->world_rank();
  const int size = rt->world_size();
  // Work on a private copy of MPI_COMM_WORLD (a split with one color keeps the ranks), so
  // that nothing else using MPI_COMM_WORLD can match kiln's messages.
  MpiCommunicator bootstrap(std::move(rt), MPI_COMM_WORLD, false, "world", rank, size);
  return bootstrap.split(0, rank, "world");
}

}  // namespace kiln

// NcclCommunicator (see nccl_communicator.h).
#include "comm/nccl/nccl_communicator.h"

#include "comm/detail.h"
#include "comm/ledger.h"
#include "core/error.h"

#include <cuda_runtime.h>
#include <nccl.h>

#if defined(KILN_NCCL_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

namespace kiln {

namespace {

using comm_detail::Clock;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    KILN_FAIL("nccl communicator: {} failed: {}", what, cudaGetErrorString(e));
  }
}

void nccl_ok(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress)
    KILN_FAIL("nccl communicator: {} failed: {} ({})", what, ncclGetErrorString(r),
              static_cast<int>(r));
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::F64: return ncclFloat64;
    case DType::E4M3:
    case DType::E5M2: return ncclUint8;  // moved, never reduced
  }
  return ncclFloat32;
}

struct NvtxScope {
#if defined(KILN_NCCL_NVTX)
  explicit NvtxScope(const char* name) { nvtxRangePushA(name); }
  ~NvtxScope() { nvtxRangePop(); }
#else
  explicit NvtxScope(const char*) {}
#endif
};

class NcclCommunicator;

// A collective in flight: start/end events on the communication stream.
class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator* comm, const LedgerEntry& entry, int64_t bytes,
           std::string description, cudaEvent_t start, cudaEvent_t end)
      : comm_(comm), entry_(entry), bytes_(bytes), description_(std::move(description)),
        start_(start), end_(end) {}
  ~NcclWork() override {
    cudaEventDestroy(start_);
    cudaEventDestroy(end_);
  }
  void wait() override;
  bool is_completed() const override;
  std::string description() const override { return description_; }

 private:
  void finish() const;
  NcclCommunicator* comm_;
  LedgerEntry entry_;  // its record in the communicator's ledger
  int64_t bytes_;
  std::string description_;
  cudaEvent_t start_, end_;
  mutable bool recorded_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> bootstrap, int device, std::string name)
      : Communicator(std::move(name)), boot_(std::move(bootstrap)), device_(device) {
    set_timeout(boot_->timeout());
    if (device_ < 0) cuda_ok(cudaGetDevice(&device_), "cudaGetDevice");
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_ok(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (boot_->rank() == 0) nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
    static_assert(sizeof(ncclUniqueId) % 4 == 0);
    boot_->broadcast(Tensor::view(&id, {static_cast<int64_t>(sizeof(id) / 4)}, DType::I32), 0);
    nccl_ok(ncclCommInitRank(&comm_, boot_->size(), id, boot_->rank()), "ncclCommInitRank");
    int32_t one = 1;
    cuda_ok(cudaMalloc(&barrier_buf_, sizeof(int32_t)), "cudaMalloc");
    cuda_ok(cudaMemcpy(barrier_buf_, &one, sizeof(one), cudaMemcpyHostToDevice), "cudaMemcpy");
    if (size() > 1) start_ledger(boot_->world_ranks());
  }

  ~NcclCommunicator() override {
    if (comm_) {
      (void)cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    cudaFree(barrier_buf_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }

  // Host tensors travel over the bootstrap communicator, which reports them itself.
  void set_tracer(TraceSink* tracer) override {
    Communicator::set_tracer(tracer);
    boot_->set_tracer(tracer);
  }
  int rank() const override { return boot_->rank(); }
  int size() const override { return boot_->size(); }
  std::string backend_name() const override { return "nccl"; }

  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op, Stream s) override {
    check_buffer(t, "all_reduce");
    if (t.device().is_cpu()) return boot_->all_reduce_async(t, op, s);
    const std::string what = comm_detail::describe(Collective::AllReduce, t, reduce_op_name(op));
    return launch({Collective::AllReduce, t.dtype(), t.numel(), -1}, static_cast<int64_t>(t.nbytes()), what, s, [&] {
      return ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                           op == ReduceOp::Sum ? ncclSum : ncclMax, comm_, stream_);
    });
  }
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& output, const Tensor& input,
                                             Stream s) override {
    check_reduce_scatter(output, input);
    if (input.device().is_cpu()) return boot_->reduce_scatter_async(output, input, s);
    const std::string what = comm_detail::describe(Collective::ReduceScatter, input);
    return launch({Collective::ReduceScatter, input.dtype(), input.numel(), -1},
                  static_cast<int64_t>(input.nbytes()), what, s, [&] {
      return ncclReduceScatter(input.raw(), output.raw(), static_cast<size_t>(output.numel()),
                               nccl_type(input.dtype()), ncclSum, comm_, stream_);
    });
  }
  std::shared_ptr<Work> all_gather_async(const Tensor& output, const Tensor& input,
                                         Stream s) override {
    check_all_gather(output, input);
    if (input.device().is_cpu()) return boot_->all_gather_async(output, input, s);
    const std::string what = comm_detail::describe(Collective::AllGather, output);
    return launch({Collective::AllGather, output.dtype(), output.numel(), -1},
                  static_cast<int64_t>(output.nbytes()), what, s, [&] {
      return ncclAllGather(input.raw(), output.raw(), static_cast<size_t>(input.numel()),
                           nccl_type(input.dtype()), comm_, stream_);
    });
  }
  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root, Stream s) override {
    check_buffer(t, "broadcast");
    check_root(root);
    if (t.device().is_cpu()) return boot_->broadcast_async(t, root, s);
    const std::string what =
        comm_detail::describe(Collective::Broadcast, t, "root " + std::to_string(root));
    return launch({Collective::Broadcast, t.dtype(), t.numel(), root}, static_cast<int64_t>(t.nbytes()), what, s, [&] {
      return ncclBroadcast(t.raw(), t.raw(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                           root, comm_, stream_);
    });
  }
  std::shared_ptr<Work> send_async(const Tensor& t, int peer, int tag, Stream s) override {
    check_buffer(t, "send");
    check_peer(peer, tag, "send");
    if (t.device().is_cpu()) return boot_->send_async(t, peer, tag, s);
    const std::string what = comm_detail::describe(Collective::Send, t, "to " + std::to_string(peer));
    return launch({Collective::Send, t.dtype(), t.numel(), peer}, static_cast<int64_t>(t.nbytes()), what, s, [&] {
      return ncclSend(t.raw(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), peer, comm_,
                      stream_);
    });
  }
  std::shared_ptr<Work> recv_async(const Tensor& t, int peer, int tag, Stream s) override {
    check_buffer(t, "recv");
    check_peer(peer, tag, "recv");
    if (t.device().is_cpu()) return boot_->recv_async(t, peer, tag, s);
    const std::string what =
        comm_detail::describe(Collective::Recv, t, "from " + std::to_string(peer));
    return launch({Collective::Recv, t.dtype(), t.numel(), peer}, static_cast<int64_t>(t.nbytes()), what, s, [&] {
      return ncclRecv(t.raw(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), peer, comm_,
                      stream_);
    });
  }
  std::shared_ptr<Work> all_to_all_async(const Tensor& output, const Tensor& input,
                                         std::span<const int64_t> send_counts,
                                         std::span<const int64_t> recv_counts,
                                         Stream s) override {
    const auto [sent, received] = check_all_to_all(output, input, send_counts, recv_counts);
    if (input.device().is_cpu())
      return boot_->all_to_all_async(output, input, send_counts, recv_counts, s);
    const Tensor in = input.view_at(0, Shape{sent});
    const std::string what = comm_detail::describe(Collective::AllToAll, in);
    // One ncclSend and one ncclRecv per peer with a non-empty piece, fused by a group
    // (inside the caller's group when one is open).
    return launch({Collective::AllToAll, in.dtype(), sent, -1}, static_cast<int64_t>(in.nbytes()), what, s, [&] {
      const bool own_group = !in_group_;
      if (own_group) nccl_ok(ncclGroupStart(), "ncclGroupStart");
      const size_t elem = dtype_size(input.dtype());
      const auto* src = static_cast<const char*>(input.raw());
      auto* dst = static_cast<char*>(output.raw());
      ncclResult_t r = ncclSuccess;
      for (int q = 0; q < size() && (r == ncclSuccess || r == ncclInProgress); ++q) {
        const auto sc = static_cast<size_t>(send_counts[static_cast<size_t>(q)]);
        const auto rc = static_cast<size_t>(recv_counts[static_cast<size_t>(q)]);
        if (sc > 0) r = ncclSend(src, sc, nccl_type(input.dtype()), q, comm_, stream_);
        if (rc > 0 && (r == ncclSuccess || r == ncclInProgress))
          r = ncclRecv(dst, rc, nccl_type(input.dtype()), q, comm_, stream_);
        src += sc * elem;
        dst += rc * elem;
      }
      if (own_group) nccl_ok(ncclGroupEnd(), "ncclGroupEnd");
      return r;
    });
  }
  std::shared_ptr<Work> barrier_async() override {
    // An all-reduce of one device int: completes when every rank has reached it.
    return launch({Collective::Barrier, DType::I32, 0, -1}, 0, "barrier", Stream{}, [&] {
      return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclMax, comm_, stream_);
    });
  }

  // Polled by NcclWork::wait(): aborts the job on an NCCL error or a timeout.
  void poll_failure(const std::string& what, Clock::time_point t0) {
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      const std::string msg =
          fmt::format("nccl error during {} on {}: {}", what, where(), ncclGetErrorString(async));
      abort_comm();
      abort_all(msg);
    }
    const double waited = comm_detail::seconds_since(t0);
    if (waited > timeout()) {
      const std::string msg = fmt::format(
          "timed out after {} s waiting for {} (parallel.timeout_s sets the limit)", timeout(), what);
      report_hang(what, comm_detail::kLedgerGatherS);
      abort_comm();
      abort_all(msg);
    }
  }
  void record_done(const LedgerEntry& entry, int64_t bytes, double seconds) {
    note_done(entry);
    record(entry.op, bytes, seconds);
  }

 protected:
  std::unique_ptr<Communicator> make_group(const std::vector<int>& ranks,
                                           const std::string& name) override {
    return std::make_unique<NcclCommunicator>(boot_->new_group(ranks, name + "/bootstrap"),
                                              device_, name);
  }
  std::unique_ptr<Communicator> make_split(int color, int key, const std::string& name) override {
    return std::make_unique<NcclCommunicator>(boot_->split(color, key, name + "/bootstrap"),
                                              device_, name);
  }

 private:
  /// What the ledger records of a call (comm/ledger.h).
  struct Call {
    Collective op;
    DType dtype;
    int64_t count;
    int peer;  // send/recv: the other rank; broadcast: the root; else -1
  };

  template <class F>
  std::shared_ptr<Work> launch(const Call& call_info, int64_t bytes, const std::string& what,
                               Stream s, F&& call) {
    const Collective c = call_info.op;
    NvtxScope range(collective_name(c));
    cudaEvent_t start = nullptr, end = nullptr;
    cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&end), "cudaEventCreate");
    auto caller = static_cast<cudaStream_t>(s.handle);
    // The collective sees everything queued before it on the caller's stream.
    cuda_ok(cudaEventRecord(ready_, caller), "cudaEventRecord");
    cuda_ok(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    cuda_ok(cudaEventRecord(start, stream_), "cudaEventRecord");
    const ncclResult_t r = call();
    if (r != ncclSuccess && r != ncclInProgress) {
      cudaEventDestroy(start);
      cudaEventDestroy(end);
      KILN_FAIL("nccl communicator: {} on {} failed: {}", what, where(), ncclGetErrorString(r));
    }
    // In a group the operation is enqueued at ncclGroupEnd: its end event is recorded there.
    if (in_group_) group_ends_.push_back(end);
    else cuda_ok(cudaEventRecord(end, stream_), "cudaEventRecord");
    const LedgerEntry entry = note_call(c, call_info.dtype, call_info.count, call_info.peer);
    std::string description = what + " on " + where();
    if (entry.site[0] != '\0') description += " at " + describe_site(entry.site);
    return std::make_shared<NcclWork>(this, entry, bytes, std::move(description), start, end);
  }

 public:
  void group_start() override {
    KILN_CHECK(!in_group_, "nccl communicator: group_start() inside a group on {}", where());
    nccl_ok(ncclGroupStart(), "ncclGroupStart");
    in_group_ = true;
  }
  void group_end() override {
    KILN_CHECK(in_group_, "nccl communicator: group_end() without group_start() on {}", where());
    in_group_ = false;
    nccl_ok(ncclGroupEnd(), "ncclGroupEnd");
    for (cudaEvent_t e : group_ends_) cuda_ok(cudaEventRecord(e, stream_), "cudaEventRecord");
    group_ends_.clear();
  }

 private:

  void abort_comm() {
    if (comm_) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

  std::unique_ptr<Communicator> boot_;
  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  bool in_group_ = false;
  std::vector<cudaEvent_t> group_ends_;  // of the operations posted in the open group
  ncclComm_t comm_ = nullptr;
  void* barrier_buf_ = nullptr;
};

bool NcclWork::is_completed() const {
  if (cudaEventQuery(end_) != cudaSuccess) return false;
  finish();
  return true;
}

void NcclWork::wait() {
  const auto t0 = Clock::now();
  std::optional<Clock::time_point> signal_seen;
  for (int polls = 0;; ++polls) {
    const cudaError_t q = cudaEventQuery(end_);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) {
      (void)cudaGetLastError();
      abort_all(fmt::format("cuda error while waiting for {}: {}", description_,
                            cudaGetErrorString(q)));
    }
    comm_->poll_failure(description_, t0);
    if ((polls & 1023) == 0) comm_detail::notice_stop_signal(signal_seen, *this);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  finish();
}

void NcclWork::finish() const {
  if (recorded_) return;
  recorded_ = true;
  float ms = 0.f;
  if (cudaEventElapsedTime(&ms, start_, end_) != cudaSuccess) (void)cudaGetLastError();
  comm_->record_done(entry_, bytes_, ms / 1e3);
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     int device) {
  KILN_CHECK(bootstrap != nullptr, "make_nccl_communicator: no bootstrap communicator");
  std::string name = bootstrap->name();
  return std::make_unique<NcclCommunicator>(std::move(bootstrap), device, std::move(name));
}

std::unique_ptr<Communicator> make_nccl_world_communicator() {
  auto world = make_world_communicator();
  int n = 0;
  cuda_ok(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  KILN_CHECK(n > 0, "nccl communicator: no GPU visible");
  return make_nccl_communicator(std::move(world), launcher_local_rank() % n);
}

std::string nccl_version() {
  int v = 0;
  nccl_ok(ncclGetVersion(&v), "ncclGetVersion");
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

}  // namespace kiln

// The MPI communicator's operation engine (internal to kiln_comm; includes mpi.h): a
// queue of operations started in submission order and driven to completion by MPI_Test,
// on a communication thread or from Work::wait(). Design: mpi_communicator.h.
#pragma once

#include "comm/detail.h"

#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::comm_detail {

inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(buf, static_cast<size_t>(len));
}

/// MPI calls report errors as return codes (MPI_ERRORS_RETURN); any error ends the job.
inline void mpi_check(int rc, const char* call, const std::string& context) {
  if (rc != MPI_SUCCESS) abort_all(fmt::format("{} failed in {}: {}", call, context, mpi_error_string(rc)));
}

/// One queued operation. `start` posts the non-blocking MPI call (or, for control
/// operations such as creating a communicator, does the whole job and leaves the request
/// null); `finish` runs after completion (conversions back to 16 bits, count checks).
struct Op {
  Collective kind = Collective::Barrier;
  int64_t bytes = 0;
  DType dtype = DType::F32;  // the ledger's record (ledger.h)
  int64_t count = 0;
  int peer = -1;
  bool control = false;  // not a collective: no statistics
  std::function<void(MPI_Request*)> start;
  std::function<void(const MPI_Status&)> finish;
  std::function<void(Collective, int64_t, double)> record;
  std::function<void()> done;  // after the Work completes (outstanding counter)
  std::shared_ptr<BasicWork> work;
  double timeout_s = 60.0;
  MPI_Request request = MPI_REQUEST_NULL;
  Clock::time_point t0;
};

/// Starts operations in submission order and drives them to completion: on its own
/// thread (threaded), or from Work::wait() on the caller's thread (inline).
class Engine {
 public:
  explicit Engine(bool threaded) : threaded_(threaded) {
    if (threaded_) thread_ = std::thread([this] { run(); });
  }
  ~Engine() {
    if (threaded_) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  bool threaded() const { return threaded_; }

  void submit(std::unique_ptr<Op> op) {
    if (!threaded_) {
      std::lock_guard<std::mutex> lock(inline_mu_);
      start(std::move(op));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(op));
    }
    cv_.notify_one();
  }

  /// Background work run each time the engine polls, where its MPI calls run (the
  /// arrival records of its communicators). `key` identifies it for remove_poller().
  void add_poller(const void* key, std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(pollers_mu_);
    pollers_[key] = std::move(fn);
  }
  void remove_poller(const void* key) {
    std::lock_guard<std::mutex> lock(pollers_mu_);
    pollers_.erase(key);
  }

  /// Inline mode: tests the operations in flight once.
  void progress() {
    std::lock_guard<std::mutex> lock(inline_mu_);
    poll();
    check_stuck();
  }

 private:
  void run() {
    int idle = 0;
    for (;;) {
      std::deque<std::unique_ptr<Op>> batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (inflight_.empty()) cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_ && queue_.empty() && inflight_.empty()) return;
        batch.swap(queue_);
      }
      for (auto& op : batch) start(std::move(op));
      if (inflight_.empty()) {
        idle = 0;
        continue;
      }
      if (poll()) {
        idle = 0;
        continue;
      }
      ++idle;
      if ((idle & 1023) == 0) check_stuck();
      // Spin briefly for latency, then back off so that an idle wait costs little CPU.
      if (idle < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(idle < 4096 ? 5 : 50));
      }
    }
  }

  void start(std::unique_ptr<Op> op) {
    op->t0 = Clock::now();
    try {
      op->start(&op->request);
    } catch (const std::exception& e) {
      abort_all(fmt::format("{}: {}", op->work->description(), e.what()));
    }
    if (op->request == MPI_REQUEST_NULL) {
      MPI_Status status{};
      complete(*op, status);
    } else {
      inflight_.push_back(std::move(op));
    }
  }

  bool poll() {
    {
      std::lock_guard<std::mutex> lock(pollers_mu_);
      for (auto& [key, fn] : pollers_) fn();
    }
    bool any = false;
    for (size_t i = 0; i < inflight_.size();) {
      Op& op = *inflight_[i];
      int flag = 0;
      MPI_Status status{};
      mpi_check(MPI_Test(&op.request, &flag, &status), "MPI_Test", op.work->description());
      if (flag) {
        complete(op, status);
        inflight_.erase(inflight_.begin() + static_cast<std::ptrdiff_t>(i));
        any = true;
      } else {
        ++i;
      }
    }
    return any;
  }

  // The waiter normally times out first; this catches operations nobody waits for.
  void check_stuck() {
    for (const auto& op : inflight_) {
      if (seconds_since(op->t0) > op->timeout_s + 5.0) {
        abort_all(fmt::format("timed out after {} s: {} never completed (parallel.timeout_s sets "
                              "the limit); another rank failed, exited or called a different "
                              "collective",
                              op->timeout_s, op->work->timeout_description()));
      }
    }
  }

  void complete(Op& op, const MPI_Status& status) {
    try {
      if (op.finish) op.finish(status);
    } catch (const std::exception& e) {
      abort_all(fmt::format("{}: {}", op.work->description(), e.what()));
    }
    if (!op.control && op.record) op.record(op.kind, op.bytes, seconds_since(op.t0));
    // The closures hold Tensor copies: drop them before the waiter wakes, so that the
    // caller's reference is the last and a buffer is freed on the caller's thread (the
    // allocators are not thread-safe), never on this one.
    op.start = nullptr;
    op.finish = nullptr;
    op.work->complete();
    if (op.done) op.done();
  }

  const bool threaded_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Op>> queue_;
  bool stop_ = false;
  std::mutex inline_mu_;
  std::vector<std::unique_ptr<Op>> inflight_;  // touched by one thread at a time
  std::mutex pollers_mu_;
  std::map<const void*, std::function<void()>> pollers_;
};

}  // namespace kiln::comm_detail

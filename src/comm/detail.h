// Internals shared by the communicator implementations (not part of the public API).
#pragma once

#include "comm/communicator.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

namespace kiln::comm_detail {

/// A Work that some other party completes. wait() blocks on a condition variable, or,
/// when `progress` is given (MPI without a communication thread), calls it in a loop to
/// drive the operation. Either way it aborts the job after `timeout_s`.
class BasicWork final : public Work {
 public:
  BasicWork(std::string description, double timeout_s, std::function<void()> progress = {});
  void wait() override;
  bool is_completed() const override { return done_.load(std::memory_order_acquire); }
  std::string description() const override { return description_; }
  /// Marks the operation done and wakes waiters.
  void complete();
  /// What the timeout message adds after the description, e.g. "rank 3 did not arrive
  /// (...)" from the communicator's arrival record. Set before the Work is handed out.
  void set_timeout_detail(std::function<std::string()> detail) { detail_ = std::move(detail); }
  /// "<description>[: <detail>]": what a timeout reports.
  std::string timeout_description() const override;

 private:
  std::string description_;
  double timeout_s_;
  std::function<void()> progress_;
  std::function<std::string()> detail_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
};

/// A Work that is already done (local collectives).
std::shared_ptr<Work> completed_work(std::string description);

/// "all_reduce(sum, fp32[1024])".
std::string describe(Collective c, const Tensor& t, const std::string& extra = {});

/// Whether the bytes of a and b overlap (neither empty).
bool overlaps(const Tensor& a, const Tensor& b);

/// The world rank abort_all() prints, and how it ends the job (MPI_Abort under MPI).
void set_world_rank(int rank);
int world_rank();
using AbortHook = void (*)(int exit_code);
void set_abort_hook(AbortHook hook);

using Clock = std::chrono::steady_clock;

/// Called while a wait for `work` is blocked: after a stop signal (ledger.h's
/// note_stop_signal), once the wait has stayed blocked kSignalWaitS seconds, writes the
/// ledger file and says where this rank waits (once per process). `seen`: when this wait
/// first saw the signal.
void notice_stop_signal(std::optional<Clock::time_point>& seen, const Work& work);
/// Seconds a rank that timed out waits for the other ranks' ledger files (ledger.h).
inline constexpr double kLedgerGatherS = 1.0;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace kiln::comm_detail

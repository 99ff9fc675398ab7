// Tracer: a recorder of Chrome trace events (the JSON format that Perfetto,
// https://ui.perfetto.dev, and chrome://tracing open).
//
// What it records (format: "Trace Event Format", Google, the document linked from
// https://github.com/catapult-project/catapult/tree/master/tracing):
//   - complete events ("ph":"X"): a name, a category, a start "ts" and a duration "dur"
//     in microseconds, pid = the rank, tid = a small per-thread id, and "args" (FLOPs and
//     bytes of an op, bytes of a collective, ...);
//   - counter events ("ph":"C"): named values over time (memory by category, ...);
//   - metadata events ("ph":"M", written by write_trace): "process_name" = "rank N" per
//     rank and "thread_name" per thread or virtual track, so every track is labelled.
//
// Cost: when the tracer is disabled, TraceScope and every record_* helper cost one
// relaxed atomic load and a branch; nothing is allocated or timed. When enabled, an
// event costs two clock reads and one short critical section (a mutex-protected
// append); ops on the CPU take tens of microseconds or more, so this is noise.
//
// Threads: every function is thread-safe. Each OS thread gets a tid on its first event
// (1, 2, ... in order of first use; name it with set_thread_name). Work that is not a
// thread of its own (collectives in flight, say) can go on a named virtual track
// (track_id("comm")), which write_trace labels like a thread.
#pragma once

#include "core/trace_sink.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::profile {

using Clock = std::chrono::steady_clock;

/// One recorded event. Times in nanoseconds of steady_clock (CLOCK_MONOTONIC on Linux:
/// shared by the processes of a node, so ranks' traces line up); write_trace converts
/// them to microseconds.
struct TraceEvent {
  std::string name;
  std::string category;
  char phase = 'X';      // 'X' complete, 'C' counter, 'i' instant
  int64_t ts_ns = 0;
  int64_t dur_ns = 0;    // 'X' only
  uint32_t tid = 0;
  double flops = 0.0;    // written as args.flops when > 0
  double bytes = 0.0;    // written as args.bytes when > 0
  std::string detail;    // written as args.shape when not empty (e.g. "N=256 IC=768 OC=2304")
  std::vector<std::pair<std::string, double>> args;  // further numeric args / counter values
};

/// The TraceSink that the trainer, `kiln bench` and the tests install in the layers
/// below (communicators, the pipeline executor, the step).
class Tracer final : public TraceSink {
 public:
  Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  /// The process-wide tracer (what trace_scope() and the helpers below use).
  static Tracer& global();

  /// Whether events are recorded: one relaxed atomic load.
  bool enabled() const override { return enabled_.load(std::memory_order_relaxed); }
  void enable() { enabled_.store(true, std::memory_order_relaxed); }
  void disable() { enabled_.store(false, std::memory_order_relaxed); }

  /// The pid of every event: the rank of this process (default 0).
  void set_rank(int rank);
  int rank() const { return rank_; }

  /// Names the calling thread's track ("main", "comm", "data"). Works while disabled.
  void set_thread_name(std::string name);
  /// The calling thread's tid (assigned on first use).
  uint32_t thread_id();
  /// A virtual track (tid) named `name`, created on first use; the same name gives the
  /// same track. For work that overlaps the calling thread's events.
  uint32_t track_id(std::string_view name);

  /// Nanoseconds of a steady_clock time point (since the clock's epoch).
  int64_t to_ns(Clock::time_point t) const;
  int64_t now_ns() const { return to_ns(Clock::now()); }

  /// Appends an event as is (thread-safe). Ignored while disabled.
  void record(TraceEvent e);
  /// A complete event on the calling thread's track (tid = 0 means: the calling thread).
  void record_complete(std::string_view name, std::string_view category, Clock::time_point start,
                       Clock::time_point end, double flops = 0.0, double bytes = 0.0,
                       std::string detail = {}, uint32_t tid = 0);
  /// TraceSink: a complete event on the calling thread's track.
  void record_span(std::string_view name, std::string_view category, Clock::time_point start,
                   Clock::time_point end) override {
    record_complete(name, category, start, end);
  }
  /// TraceSink: a complete event of category "comm" with args.bytes on the virtual track
  /// `track`.
  void record_collective(std::string_view name, int64_t bytes, Clock::time_point start,
                         Clock::time_point end, std::string_view track) override;
  /// A counter event: each (series, value) becomes one line of the counter track `name`.
  void record_counter(std::string_view name,
                      std::vector<std::pair<std::string, double>> values);

  /// A copy of the events recorded so far, in recording order.
  std::vector<TraceEvent> events() const;
  size_t size() const;
  /// Drops the events (thread ids and names are kept).
  void clear();

  /// The whole trace as Chrome trace JSON text: {"traceEvents": [...metadata, events],
  /// "displayTimeUnit": "ms", "otherData": {...}}.
  std::string to_json() const;
  /// Writes to_json() to `path` atomically (a temporary file in the same directory,
  /// then rename). Throws kiln::Error naming the file when it cannot be written.
  void write_trace(const std::filesystem::path& path) const;

 private:
  std::atomic<bool> enabled_{false};
  int rank_ = 0;
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
  std::map<uint32_t, std::string> track_names_;  // tid -> name
  std::map<std::string, uint32_t, std::less<>> virtual_tracks_;
};

/// The RAII span of core/trace_sink.h, here for the profiler's users:
/// `profile::TraceScope s(tracer, "forward");`.
using kiln::TraceScope;

/// A scope on the global tracer: `auto t = profile::trace_scope("optimizer");`.
/// The trainer uses "data", "forward", "backward", "optimizer", "checkpoint", "eval".
inline TraceScope trace_scope(std::string_view name, std::string_view category = "phase") {
  return TraceScope(Tracer::global(), name, category);
}

/// One collective (or send/recv) that ran from `start` to `end` and moved `bytes` (the
/// nccl-tests size, see comm/communicator.h), on the virtual track `track` of the global
/// tracer (Tracer::record_collective). Callable from any thread. (The communicators
/// report to the TraceSink installed in them instead, Communicator::set_tracer.)
void trace_collective(std::string_view name, int64_t bytes, Clock::time_point start,
                      Clock::time_point end, std::string_view track = "comm");

/// As above, for a caller that knows the duration of an operation that just completed:
/// it ran from now - seconds to now.
void trace_collective_done(std::string_view name, int64_t bytes, double seconds,
                           std::string_view track = "comm");

/// A counter sample on the global tracer (e.g. memory by category in bytes).
void trace_counter(std::string_view name, std::vector<std::pair<std::string, double>> values);

/// Merges the traceEvents of several trace files (one per rank) into one file that
/// Perfetto shows as one timeline with a process per rank. Atomic write.
void merge_trace_files(const std::vector<std::filesystem::path>& inputs,
                       const std::filesystem::path& output);

}  // namespace kiln::profile

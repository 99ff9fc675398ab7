// TraceSink: where the layers below the profiler (the communicators, the pipeline
// executor, the step) report timed work for a trace, passed in as a StepObserver is
// (Communicator::set_tracer, PipelineExecutor::set_tracer, TrainStep::set_tracer), never
// reached as a global. src/profile's Tracer implements it; the trainer, `kiln bench` and
// the tests install one. Where none is installed nothing is reported, at the cost of a
// null check.
//
// Threads: implementations are thread-safe (a communicator reports from its
// communication thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

namespace kiln {

class TraceSink {
 public:
  using Clock = std::chrono::steady_clock;

  virtual ~TraceSink() = default;
  /// Whether events are recorded now (cheap: a relaxed atomic load in the Tracer).
  virtual bool enabled() const = 0;
  /// A span of work on the calling thread's track from `start` to `end`, in `category`
  /// ("phase" for the step's phases: "forward", "backward", "optimizer", ...).
  virtual void record_span(std::string_view name, std::string_view category,
                           Clock::time_point start, Clock::time_point end) = 0;
  /// A collective (or send/recv) `name` that ran from `start` to `end` and moved `bytes`
  /// (the nccl-tests size, see comm/communicator.h), on the virtual track `track`
  /// (category "comm").
  virtual void record_collective(std::string_view name, int64_t bytes, Clock::time_point start,
                                 Clock::time_point end, std::string_view track) = 0;

  /// A collective that just completed after `seconds`: it ran from now - seconds to now.
  void record_collective_done(std::string_view name, int64_t bytes, double seconds,
                              std::string_view track) {
    const auto end = Clock::now();
    const auto start =
        end - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    record_collective(name, bytes, start, end, track);
  }
};

/// RAII: records one span from construction to destruction when a sink is given and
/// enabled at construction. `name` and `category` must outlive the scope (string
/// literals). No sink, or a disabled one: a null check (and one relaxed atomic load).
class TraceScope {
 public:
  TraceScope(TraceSink* sink, std::string_view name, std::string_view category = "phase")
      : sink_(sink != nullptr && sink->enabled() ? sink : nullptr),
        name_(name),
        category_(category) {
    if (sink_) start_ = TraceSink::Clock::now();
  }
  TraceScope(TraceSink& sink, std::string_view name, std::string_view category = "phase")
      : TraceScope(&sink, name, category) {}
  ~TraceScope() {
    if (sink_) sink_->record_span(name_, category_, start_, TraceSink::Clock::now());
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  bool active() const { return sink_ != nullptr; }

 private:
  TraceSink* sink_;
  std::string_view name_, category_;
  TraceSink::Clock::time_point start_{};
};

}  // namespace kiln

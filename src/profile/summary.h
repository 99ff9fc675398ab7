// The per-op summary of a profiled window, and ProfileWindow, the helper the trainer
// drives over [profile] steps = [a, b].
//
// Summary table, one row per op name (every complete event that is not a "phase" or
// "step" scope: Backend ops from ProfilingBackend, collectives from trace_collective):
//   calls      number of events
//   total ms   summed durations
//   % step     total / the summed duration of the window's "step" events (or, without
//              step events, the span from the first event's start to the last one's end)
//   GFLOP/s    summed op FLOPs / total time      GB/s   summed bytes / total time
//   bound      the roofline's limit for this op: "flops" when flops/peak_flops >
//              bytes/peak_bandwidth (the op cannot beat the FLOP peak), else "memory"
//   % peak     achieved rate of the bound resource / its peak (GFLOP/s / peak GFLOP/s or
//              GB/s / peak GB/s): 100% = on the roofline
// then the same by kind (op_kind: gemm, attention, norms, elementwise, classifier,
// optimizer, communication, memory) in ms per step, with "idle" = the time inside the
// "step" events that no op covers (each op clipped to its step, overlapping ops once;
// on a GPU timed with device events: the device idle), and the phases
// ("data", "forward", "backward", "optimizer", ... scopes) with their total time and
// share of the step.
#pragma once

#include "core/allocator.h"
#include "profile/tracer.h"

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::profile {

class ProfilingBackend;

/// Peak rates to compare against (0 = unknown: the "% peak" column shows "-").
struct Peaks {
  double flops = 0.0;      // FLOP/s, e.g. measure_gemm_flops()
  double bandwidth = 0.0;  // bytes/s, e.g. measure_copy_bandwidth()
};

struct OpStats {
  std::string name;
  std::string category;
  int64_t calls = 0;
  double total_ns = 0.0;
  double flops = 0.0;
  double bytes = 0.0;
};

struct Summary {
  std::vector<OpStats> ops;     // by total time, largest first
  std::vector<OpStats> kinds;   // the ops grouped by op_kind (name = the kind), largest first
  std::vector<OpStats> phases;  // "phase" scopes, by total time
  int64_t steps = 0;            // "step" events in the window
  double step_ns = 0.0;         // their summed duration (or the window span)
  double op_ns = 0.0;           // summed duration of all ops
  double idle_ns = 0.0;         // time inside the steps that no op covers (each op clipped
                                // to the step, overlaps counted once)
};

/// The kind of an op event for the per-kind table: "classifier" for ops of the
/// classifier's OpRegion ("... [classifier]") and the losses, "communication" for
/// collectives (category "comm"), "gemm" (linear_*), "attention" (attention_*),
/// "norms" (layernorm_*, rmsnorm_*), "optimizer" (adamw*, ema_update, sum_squares,
/// clip_coefficient), "memory" (copy*, fill), else "elementwise".
std::string op_kind(std::string_view name, std::string_view category);
/// Aggregates complete events.
Summary summarize(const std::vector<TraceEvent>& events);
/// The table described above (lines end with '\n').
std::string format_summary(const Summary& summary, const Peaks& peaks);

/// Drives the profiled window [a, b) of optimizer updates (updates counted from 0):
///   ProfileWindow window(config.profile.steps, run_dir / "trace_rank0.json", peaks);
///   while (...) { window.begin_step(step_); train_step(); window.end_step(); }
/// begin_step(a) clears and enables the tracer; end_step() records a "step" event (and
/// a memory counter when an allocator is set); after update b-1 it disables the tracer,
/// writes the trace (atomically) and "<trace stem>.summary.txt", and prints the summary.
/// A window cut short (the run ends or is preempted first) is finished by finish() or
/// the destructor. With `steps` empty every call is a no-op.
class ProfileWindow {
 public:
  ProfileWindow(std::vector<int64_t> steps, std::filesystem::path trace_path, Peaks peaks,
                Tracer& tracer = Tracer::global(), bool print = true);
  ~ProfileWindow();
  ProfileWindow(const ProfileWindow&) = delete;
  ProfileWindow& operator=(const ProfileWindow&) = delete;

  /// Memory counters (bytes per category) are sampled at the end of each profiled step.
  void set_allocator(Allocator* allocator) { allocator_ = allocator; }
  /// The profiling backend: end_step() flushes its device-timed ops (OpTiming::
  /// DeviceEvents) and samples its allocator's memory counters (as set_allocator).
  void set_backend(ProfilingBackend* backend);
  bool configured() const { return steps_.size() == 2; }
  /// True between begin_step(a) and the end of the window.
  bool recording() const { return recording_; }

  void begin_step(int64_t step);
  void end_step();
  /// Ends the window now if it is recording (writes trace and summary). Idempotent.
  void finish();
  /// The last summary text ("" before the window ended).
  const std::string& summary_text() const { return summary_text_; }

 private:
  std::vector<int64_t> steps_;
  std::filesystem::path trace_path_;
  Peaks peaks_;
  Tracer& tracer_;
  bool print_;
  Allocator* allocator_ = nullptr;
  ProfilingBackend* backend_ = nullptr;
  bool recording_ = false;
  bool done_ = false;
  int64_t step_ = -1;
  Clock::time_point step_start_{};
  std::string summary_text_;
};

}  // namespace kiln::profile

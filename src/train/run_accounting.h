// The run's timing and throughput accounting, apart from the loop that measures it: which
// updates are timed (those after the run's first untimed_steps: warm-up), their wall
// seconds and the pipeline's busy and span seconds, the seconds the training thread waited
// for data-parallel communication, and the tensor-parallel traffic of every step tried.
#pragma once

#include "comm/communicator.h"
#include "parallel/pipeline.h"
#include "parallel/tp_traffic.h"

#include <cstdint>

namespace kiln {

struct TrainResult;

class RunAccounting {
 public:
  /// A run that starts after update `first_step` and leaves its first `untimed_steps`
  /// updates out of the timing.
  RunAccounting(int64_t first_step, int64_t untimed_steps)
      : first_step_(first_step), untimed_steps_(untimed_steps) {}

  /// Whether the update that made `step` updates done is timed.
  bool timed(int64_t step) const { return step > first_step_ + untimed_steps_; }
  /// Every step tried (a skipped fp16 one too): the tp communicator's traffic between its
  /// statistics before and after the step.
  void add_tp_traffic(const CommStats& before, const CommStats& after);
  /// Every step tried, `step` the updates done after it: the ep communicator's all_to_all
  /// calls, bytes and seconds between its statistics before and after, and the seconds
  /// the layers waited for them (`exposed`), counted when timed.
  void add_ep_traffic(int64_t step, const CommStats& before, const CommStats& after,
                      double exposed);
  /// Every step tried, `step` the updates done after it: the seconds the training thread
  /// waited for data-parallel communication, counted when timed.
  void add_comm_wait(int64_t step, double seconds);
  /// Every applied update, `step` the updates done after it: its wall seconds and the
  /// pipeline's busy and span seconds, counted when timed.
  void add_update(int64_t step, double seconds, const pp::PipelineExecutor::Timing& pipeline);

  /// The mean seconds of the timed updates so far; `fallback` before any.
  double mean_update_seconds(double fallback) const {
    return timed_steps_ > 0 ? timed_seconds_ / timed_steps_ : fallback;
  }
  int64_t timed_steps() const { return timed_steps_; }
  int64_t tried_steps() const { return tried_steps_; }
  double pipeline_busy_s() const { return pp_busy_; }
  double pipeline_span_s() const { return pp_span_; }

  /// r.step_time_s, r.timed_steps, r.tokens_per_s (of `tokens_per_step` tokens an
  /// update), r.comm_exposed_s, r.tp_measured (the sum over the steps tried) and
  /// r.ep_measured (over the timed updates).
  void fill(TrainResult& r, int64_t tokens_per_step) const;

 private:
  int64_t first_step_ = 0, untimed_steps_ = 1;
  double timed_seconds_ = 0.0;
  int64_t timed_steps_ = 0, tried_steps_ = 0;
  double pp_busy_ = 0.0, pp_span_ = 0.0;  // over the timed updates
  double comm_exposed_ = 0.0;             // over the timed updates
  TpTraffic tp_measured_;                 // over every step tried
  CollectiveStats ep_all_to_all_;         // over the timed updates
  double ep_exposed_ = 0.0;               // over the timed updates
};

}  // namespace kiln

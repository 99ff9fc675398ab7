#include "train/run_accounting.h"

#include "train/trainer.h"

namespace kiln {

void RunAccounting::add_tp_traffic(const CommStats& before, const CommStats& after) {
  ++tried_steps_;  // every step moves tp traffic, a skipped fp16 one too
  for (size_t c = 0; c < after.per.size(); ++c) {  // summed here, per step at the end
    tp_measured_.calls[c] += after.per[c].count - before.per[c].count;
    tp_measured_.bytes[c] += after.per[c].bytes - before.per[c].bytes;
  }
}

void RunAccounting::add_ep_traffic(int64_t step, const CommStats& before, const CommStats& after,
                                   double exposed) {
  if (!timed(step)) return;
  ep_exposed_ += exposed;
  const CollectiveStats &a = after.of(Collective::AllToAll), &b = before.of(Collective::AllToAll);
  ep_all_to_all_.count += a.count - b.count;
  ep_all_to_all_.bytes += a.bytes - b.bytes;
  ep_all_to_all_.seconds += a.seconds - b.seconds;
}

void RunAccounting::add_comm_wait(int64_t step, double seconds) {
  if (timed(step)) comm_exposed_ += seconds;
}

void RunAccounting::add_update(int64_t step, double seconds,
                               const pp::PipelineExecutor::Timing& pipeline) {
  if (!timed(step)) return;  // the first ones are warm-up
  timed_seconds_ += seconds, ++timed_steps_;
  pp_busy_ += pipeline.busy, pp_span_ += pipeline.span;
}

void RunAccounting::fill(TrainResult& r, int64_t tokens_per_step) const {
  r.comm_exposed_s = comm_exposed_;
  r.tp_measured = tp_measured_;
  r.ep_measured = ep_all_to_all_;
  r.ep_exposed_s = ep_exposed_;
  r.step_time_s = timed_steps_ > 0 ? timed_seconds_ / static_cast<double>(timed_steps_) : 0.0;
  r.timed_steps = timed_steps_;
  r.tokens_per_s = timed_steps_ > 0
                       ? static_cast<double>(tokens_per_step) * timed_steps_ / timed_seconds_
                       : 0.0;
}

}  // namespace kiln

// Stragglers: which rank is slow, measured every logged update (docs/reliability.md,
// "Stragglers").
//
// In a collective every rank waits for the slowest, so all ranks see about the same update
// time; what tells the slow rank apart is its compute time, the update's wall time less the
// time this rank waited for its data-parallel communication (DataParallel's exposed wait). At
// each logged update the trainer gathers every rank's mean update and compute time over the
// updates since the previous logged one (one all_gather of 2 doubles per rank), writes the
// slowest rank's against the median to metrics.jsonl, and warns, naming the rank, when the same
// rank's compute time stays at least log.straggler_factor times the median for
// log.straggler_windows logged updates in a row.
#pragma once

#include "comm/communicator.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

/// One rank's mean times (seconds per update) over a logging window.
struct RankTimes {
  double step_s = 0;     // wall time of an update
  double compute_s = 0;  // wall time less the exposed data-parallel communication wait
};

/// The ranks of one window against each other: the rank whose compute time is the largest
/// (the lowest such rank on a tie) and the medians over all ranks (the mean of the two middle
/// values for an even count).
struct StragglerSummary {
  int slowest_rank = 0;
  double slowest_step_s = 0, median_step_s = 0;
  double slowest_compute_s = 0, median_compute_s = 0;
  /// slowest_compute_s / median_compute_s (1 when the median is 0).
  double ratio() const;
};

/// Throws kiln::Error for an empty `ranks`.
StragglerSummary summarize_ranks(const std::vector<RankTimes>& ranks);

/// Accumulates this rank's update and wait times between logged updates.
class RankWindow {
 public:
  void add(double step_s, double comm_wait_s);
  /// The window's means (zeros for an empty window), and a new window.
  RankTimes take();

 private:
  double step_s_ = 0, wait_s_ = 0;
  int64_t updates_ = 0;
};

/// Every rank's times, in rank order: an all_gather over `world` (collective).
std::vector<RankTimes> gather_rank_times(Communicator& world, const RankTimes& mine);

/// Fault injection for tests: KILN_SLOW_RANK=RANK:MS makes every update of world rank RANK
/// sleep MS milliseconds inside its timed part (a straggler). The seconds to sleep on
/// `world_rank` of `world_size` (0 without the variable, or on another rank). Throws
/// kiln::Error naming the variable for a malformed value, a rank outside the world or a
/// delay that is not finite.
double injected_update_delay_s(int world_rank, int world_size);

/// Decides when to warn: `factor` (log.straggler_factor; 0 = never) and `windows`
/// (log.straggler_windows, >= 1).
class StragglerWatch {
 public:
  StragglerWatch(double factor, int windows);
  /// The warning, once per episode, when the same rank has been the slowest with ratio() >=
  /// factor for `windows` observations in a row; nullopt otherwise. An episode ends when that
  /// rank falls below the factor (or another rank becomes the slowest).
  std::optional<std::string> observe(const StragglerSummary& s);

 private:
  double factor_;
  int windows_;
  int rank_ = -1;   // the rank of the current run of slow windows
  int count_ = 0;   // its length
  bool warned_ = false;
};

}  // namespace kiln

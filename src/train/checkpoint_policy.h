// When the trainer saves a checkpoint, when it stops early, and how many checkpoints it
// keeps ([checkpoint] every and keep, docs/config.md; the exit interval of `kiln train
// --exit-interval`). Decisions only: the trainer writes (trainer_checkpoint.cpp).
#pragma once

#include "config/config.h"

#include <cstdint>
#include <filesystem>

namespace kiln {

class CheckpointPolicy {
 public:
  /// `section`: [checkpoint]; `total_steps`: train.steps; `stop_at`: the last update this
  /// process runs (total_steps, or less under an exit interval).
  CheckpointPolicy(const CheckpointSection& section, int64_t total_steps, int64_t stop_at);

  /// Whether the run stops after update `step` (1-based count of updates done) although
  /// training is not finished: a signal reached some rank (`signalled`, agreed on by all),
  /// or the exit interval ends here before train.steps.
  bool preempt(int64_t step, bool signalled) const;
  /// Whether to save after update `step`: every `checkpoint.every` updates (0: never
  /// periodically), when preempted, and after the last update of train.steps.
  bool save_now(int64_t step, bool preempted) const;
  /// After a committed save: keeps the newest `checkpoint.keep` checkpoints under
  /// `ckpt_root` (0: all) and removes interrupted saves (checkpoint::prune_checkpoints;
  /// throws kiln::Error as it does). Rank 0 only, when no save is in progress.
  void prune(const std::filesystem::path& ckpt_root) const;
  /// The last update this process runs.
  int64_t stop_at() const { return stop_at_; }

 private:
  int64_t every_, total_steps_, stop_at_;
  int keep_;
};

}  // namespace kiln

#include "train/checkpoint_policy.h"

#include "checkpoint/checkpoint.h"

namespace kiln {

CheckpointPolicy::CheckpointPolicy(const CheckpointSection& section, int64_t total_steps,
                                   int64_t stop_at)
    : every_(section.every), total_steps_(total_steps), stop_at_(stop_at), keep_(section.keep) {}

bool CheckpointPolicy::preempt(int64_t step, bool signalled) const {
  return signalled || (step == stop_at_ && stop_at_ < total_steps_);
}

bool CheckpointPolicy::save_now(int64_t step, bool preempted) const {
  const bool periodic = every_ > 0 && step % every_ == 0;
  return periodic || preempted || step == total_steps_;
}

void CheckpointPolicy::prune(const std::filesystem::path& ckpt_root) const {
  checkpoint::prune_checkpoints(ckpt_root, keep_);
}

}  // namespace kiln

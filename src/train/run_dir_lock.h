// One training run per run directory: an exclusive OS lock (flock) on RUN_DIR/kiln.lock
// held for the life of the run.
#pragma once

#include <filesystem>

namespace kiln {

/// Takes an exclusive flock(2) on `dir`/kiln.lock (creating `dir` and the file as needed)
/// without waiting, and holds it until destroyed. The file records the holder ("pid P on
/// host H") for the message of the next comer. A lock whose holder died is free: the
/// kernel drops flock locks with the process, so a stale file never blocks.
/// Throws kiln::Error "run directory D is in use by another kiln train (pid P on host H)"
/// when another process holds it, or naming the file when it cannot be opened.
class RunDirLock {
 public:
  explicit RunDirLock(const std::filesystem::path& dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace kiln

// A checkpoint's files written on a thread of their own while training goes on
// (checkpoint.async; docs/reliability.md, "Asynchronous saves").
//
// The trainer copies its state to host buffers at the save step (the stall), hands them and
// the CheckpointWriter that borrows them to a BackgroundSave, and trains on. The thread writes
// and fsyncs this rank's files in the checkpoint's temporary directory; nothing there is
// visible to --resume auto until rank 0 commits (manifest, rename), which the trainer does on
// its own thread once every rank's write has finished, known from the agreement that ends
// each update (Trainer::checkpoint_or_stop). No collective runs on the thread.
#pragma once

#include "checkpoint/checkpoint.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace kiln {

/// What a save takes from the trainer at its step: the writer with every tensor added (it
/// borrows the trainer's host copies, untouched until the save has finished) and (rank 0)
/// what commit() needs, captured then, not later.
struct SaveContents {
  std::unique_ptr<checkpoint::CheckpointWriter> writer;
  int64_t step = 0;
  nlohmann::json state;                       // rank 0: the trainer's state at the step
  std::map<std::string, std::string> extra;   // rank 0: config.toml, the data's files
  double stall_s = 0;  // seconds training stopped for the save (capture, and wait_s)
  double wait_s = 0;   // of which waiting for the previous save to finish
};

class BackgroundSave {
 public:
  /// Starts writing this rank's files of `contents` on a new thread.
  explicit BackgroundSave(SaveContents contents);
  /// Waits for the thread.
  ~BackgroundSave();
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;

  /// Whether the thread has finished (written, or failed).
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  /// Waits until finished(); the seconds waited.
  double wait();
  /// After finished(): the write error's one-line message, "" when the files are on disk.
  const std::string& error() const { return error_; }
  /// After finished(): the seconds the thread took.
  double write_seconds() const { return write_s_; }
  SaveContents& contents() { return contents_; }

 private:
  SaveContents contents_;
  std::string error_;
  double write_s_ = 0;
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace kiln

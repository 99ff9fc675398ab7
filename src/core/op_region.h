// OpRegion: names the backend calls issued inside a scope (the classifier's), so that a
// profile tells them from the same ops elsewhere: profile::ProfilingBackend records
// "linear_forward [classifier]" next to the blocks' "linear_forward". One thread_local
// store each way, profiling or not; it knows nothing of devices or of profiling, so
// layers (src/nn) may use it.
#pragma once

namespace kiln {

/// The innermost OpRegion of the calling thread, or nullptr.
inline thread_local const char* current_op_region = nullptr;

/// RAII: backend calls issued by this thread until destruction carry `name` (a string
/// literal).
class OpRegion {
 public:
  explicit OpRegion(const char* name) : prev_(current_op_region) { current_op_region = name; }
  ~OpRegion() { current_op_region = prev_; }
  OpRegion(const OpRegion&) = delete;
  OpRegion& operator=(const OpRegion&) = delete;

 private:
  const char* prev_;
};

}  // namespace kiln

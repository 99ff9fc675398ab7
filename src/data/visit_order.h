// VisitOrder: which samples a data-parallel rank reads, in which order, shared by the text
// and image loaders (data/loader.h, data/image_dataset.h).
//
// Without shuffle, epoch e visits samples 0, 1, 2, ...; with shuffle, a Fisher-Yates
// permutation of all samples driven by Philox(seed, stream = e), so every sample is
// visited exactly once per epoch and the order depends only on (seed, e). A global batch
// is micro_batch * dp_size consecutive positions of the visiting order; rank r takes
// positions [r*micro_batch, (r+1)*micro_batch). All ranks advance by the whole global
// batch, so they read disjoint samples and the position (epoch, index) does not depend
// on dp_size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::data {

/// The loader's position: the next sample is visiting-order position `index` of `epoch`.
struct LoaderState {
  int64_t epoch = 0;
  int64_t index = 0;
  bool operator==(const LoaderState&) const = default;
};

class VisitOrder {
 public:
  VisitOrder() = default;  // no samples; assign a constructed one before use
  /// `samples` per epoch, 1 to 2^32 (kiln::Error naming `what` otherwise).
  VisitOrder(int64_t samples, uint64_t seed, bool shuffle, const std::string& what);

  /// This rank's samples of the next global batch (micro_batch of them), advancing the
  /// position by micro_batch * dp_size (into the next epoch when needed). Throws
  /// kiln::Error on bad arguments.
  std::vector<int64_t> next_batch(int micro_batch, int dp_rank, int dp_size);
  /// The sample visited at position `index` of epoch `epoch`.
  int64_t sample_at(int64_t epoch, int64_t index);

  LoaderState state() const { return state_; }
  /// Throws kiln::Error when s.index is outside [0, samples()) or s.epoch < 0.
  void set_state(const LoaderState& s);
  int64_t samples() const { return samples_; }

 private:
  void ensure_permutation(int64_t epoch);

  int64_t samples_ = 0;
  uint64_t seed_ = 0;
  bool shuffle_ = false;
  std::string what_;
  LoaderState state_;
  int64_t perm_epoch_ = -1;
  std::vector<uint32_t> perm_;
};

}  // namespace kiln::data

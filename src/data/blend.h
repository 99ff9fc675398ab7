// Weighted blends of prepared data sets (config key data.blend; docs/data.md, "Blends").
//
// Which data set each sample of the blended stream comes from: sample n goes to the data
// set whose count so far lags furthest behind its share, argmax_d (w_d * (n + 1) - c_d),
// ties to the lower index (Megatron-LM's build_blending_indices,
// megatron/core/datasets/helpers.cpp, with n + 1 for its max(n, 1)). After n samples every
// count c_d is within 1 of w_d * n: exact, deterministic, and the same for any seed. Each
// data set's own samples are then visited in its own shuffled epochs (VisitOrder), so no
// sample of a data set repeats before all of it was drawn.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::data {

/// One entry of a blend: a data set directory and its weight (> 0; normalized over all).
struct BlendPart {
  std::string dir;
  double weight = 0.0;
};

/// Parses data.blend's Megatron-style list ["0.3", "dir/a", "0.7", "dir/b"]: weight and
/// directory pairs. Throws kiln::Error naming `what` (the key and file) for an odd count,
/// a weight that is not a finite positive number, an empty or repeated directory.
std::vector<BlendPart> parse_blend(const std::vector<std::string>& list, const std::string& what);

/// The data set of each sample of the blended stream, in order.
class BlendSchedule {
 public:
  /// `weights` > 0, normalized here. Throws kiln::Error when empty or not positive.
  explicit BlendSchedule(std::vector<double> weights);
  /// The data set of sample position(), and its ordinal among that data set's samples;
  /// advances.
  std::pair<int, int64_t> next();
  /// Samples drawn so far: position() = sum of counts().
  int64_t position() const { return position_; }
  const std::vector<int64_t>& counts() const { return counts_; }
  /// Back to position `n` (replays the schedule from 0: n * data sets steps).
  void seek(int64_t n);

 private:
  std::vector<double> weights_;
  std::vector<int64_t> counts_;
  int64_t position_ = 0;
};

}  // namespace kiln::data

// The layout tests' gradient check: every gradient element a rank's step holds (its
// optimizer segments, any ZeRO, tp or pp cut), placed by global name and element, against
// the single-process step's whole gradient.
#pragma once

#include "train/train_step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace kiln::testing {

/// |got - want| <= tol * max(min_scale, max |want| of the tensor) for each element `got`
/// holds. Returns a failure naming the first element that is off, or success when some
/// element was compared.
inline ::testing::AssertionResult grads_match(Backend& be, TrainStep& got, TrainStep& want,
                                              double tol, double min_scale) {
  int64_t compared = 0;
  for (const AdamWSegment& seg : got.data_parallel().optimizer_segments()) {
    const std::vector<float> full = download_f32(be, want.model().grad(seg.spec.name));
    const std::vector<float> mine = download_f32(be, seg.grad);
    double scale = min_scale;
    for (float x : full) scale = std::max(scale, std::fabs(static_cast<double>(x)));
    for (const auto& run : seg.spec.slice.global_runs(seg.spec.shape, seg.begin, seg.end))
      for (int64_t e = run.global_begin; e < run.global_end; ++e, ++compared) {
        const auto local = static_cast<size_t>(run.local_begin - seg.begin + (e - run.global_begin));
        const double have = mine[local], ref = full[static_cast<size_t>(e)];
        if (!(std::fabs(have - ref) <= tol * scale))
          return ::testing::AssertionFailure() << seg.spec.name << " element " << e << ": " << have
                                               << " vs " << ref << " (bound " << tol * scale << ")";
      }
  }
  if (compared == 0) return ::testing::AssertionFailure() << "no gradient element compared";
  return ::testing::AssertionSuccess();
}

}  // namespace kiln::testing

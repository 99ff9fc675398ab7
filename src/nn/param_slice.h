// ParamSlice: the elements of a global parameter that one rank holds under tensor
// parallelism (nn/tensor_parallel.h) and expert parallelism (nn/expert_parallel.h).
//
// Two cuts, applied in this order:
//   ep  dimension 0 of a stacked expert tensor [E, ...] cut into ep_parts equal
//       contiguous ranges; the rank holds range ep_index (experts [ep_index El,
//       (ep_index+1) El), El = E / ep_parts).
//   tp  along dimension `dim` (> 0 when the ep cut is there too), each of `pieces`
//       (consecutive extents summing to the size of `dim`: the q, k and v rows of a fused
//       projection, SwiGLU's gate and up; empty = one piece, the whole dim) cut into
//       `parts` equal ranges; the rank holds range `index` of every piece, concatenated in
//       piece order.
// parts == ep_parts == 1 is the whole tensor (replicated). Checkpoints, initial values
// and the optimizer's stochastic rounding place a rank's elements by their global
// row-major indices (global_runs), so any layout reads what any other wrote.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::nn {

struct ParamSlice {
  int dim = 0;
  std::vector<int64_t> pieces;
  int parts = 1, index = 0;     // the tp cut
  int ep_parts = 1, ep_index = 0;  // the ep cut of dimension 0

  /// Whether the tp cut splits the tensor (every tp rank holds other elements).
  bool tp_sharded() const { return parts > 1; }
  /// Whether the ep cut splits the tensor (every ep rank holds other experts).
  bool ep_sharded() const { return ep_parts > 1; }
  /// The global shape with dimension 0 divided by ep_parts, then `dim` by parts.
  Shape local_shape(const Shape& global) const;
  /// The [begin, end) ranges of `dim` the tp cut keeps, in local order.
  std::vector<std::pair<int64_t, int64_t>> ranges(const Shape& global) const;
  /// Throws kiln::Error naming `what` unless the indices are in range, dim is in range,
  /// the pieces sum to the global size of dim and each divides by parts, ep_parts divides
  /// dimension 0 and the two cuts are on different dimensions.
  void check(const Shape& global, const std::string& what) const;
  /// The global row-major index of every local element, in local row-major order (the
  /// map a checkpoint, an initialiser or a test uses to place the rank's elements).
  std::vector<int64_t> global_indices(const Shape& global) const;
  /// The same map as maximal runs: [begin, end) ranges of global row-major indices whose
  /// concatenation, in order, is the rank's elements (one run when replicated).
  std::vector<std::pair<int64_t, int64_t>> global_runs(const Shape& global) const;
  /// One run of local elements at consecutive global indices.
  struct Run {
    int64_t global_begin = 0, global_end = 0;  // global row-major indices
    int64_t local_begin = 0;                   // the run's first local element
  };
  /// The local elements [local_begin, local_end) (a ZeRO slice of the rank's tensor) as
  /// global runs, in local order. Throws kiln::Error for a range outside the local tensor.
  std::vector<Run> global_runs(const Shape& global, int64_t local_begin, int64_t local_end) const;

 private:
  /// The rank's experts' block of the global tensor: `global` with dimension 0 = El.
  Shape expert_block(const Shape& global) const;
};

}  // namespace kiln::nn

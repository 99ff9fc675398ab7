// How a grouped linear (Backend::grouped_linear_forward / _backward) splits each expert's
// rows on the backends whose GEMMs are planned per shape (the CPU's oneDNN primitives,
// the CUDA backend's cuBLASLt plans): an expert's row count changes from step to step,
// so its rows run as pieces whose sizes are powers of two, largest first. One projection
// then plans at most log2(M) + 1 shapes over a whole run instead of one per row count
// seen (and tunes at most that many where GEMM tuning is on), for at most that many
// GEMMs per expert instead of one. src/plan/scratch_models.cpp sizes the CPU's scratch
// from the same pieces.
#pragma once

#include <cstdint>

namespace kiln {

/// f(expert, first row, rows) for the power-of-two pieces of every expert's rows
/// [offsets[e], offsets[e+1]), experts in order, each expert's pieces largest first;
/// offsets [E+1] on the host, already checked (checks::grouped_linear_offsets).
template <class F>
void for_each_grouped_piece(const int32_t* offsets, int64_t E, F&& f) {
  for (int64_t e = 0; e < E; ++e) {
    int64_t r = offsets[e];
    const int64_t m = offsets[e + 1] - r;
    for (int b = 62; b >= 0; --b) {
      const int64_t piece = int64_t{1} << b;
      if ((m & piece) == 0) continue;
      f(e, r, piece);
      r += piece;
    }
  }
}

}  // namespace kiln

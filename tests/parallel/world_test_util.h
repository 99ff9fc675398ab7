// Helpers of the multi-rank layer tests (tp_layers_test, ring_attention_test).
#pragma once

#include "backend/registry.h"

#include <random>
#include <vector>

namespace kiln::testing {

/// n standard normal floats from `seed` (the same on every rank).
inline std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

/// One CPU backend for the process, never destroyed: the MPI communication thread may
/// release the last copy of a buffer (and so call its allocator) after a test returns.
inline Backend* cpu_backend() {
  static Backend* be = make_backend("cpu").release();
  return be;
}

}  // namespace kiln::testing

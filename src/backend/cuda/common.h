// Shared by the CUDA backend's host code and its .cu files: error checks that turn a CUDA
// status into one kiln::Error line, launch-size helpers, and the NVTX range used around
// every op. Nothing here includes fmt or kiln's tensor headers, so .cu files stay light.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

/// Throws kiln::Error "cuda: <what> failed: <error string> (<file>:<line>)" unless ok.
void check(cudaError_t status, const char* what, const char* file, int line);
/// Throws kiln::Error with `message`.
[[noreturn]] void fail(const char* message);

/// Blocks of `threads` covering n items, capped (kernels use grid-stride loops).
inline unsigned grid_for(int64_t n, int threads, int64_t cap = 1 << 20) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b < cap ? b : cap);
}

/// Stable names for the element types the kernels instantiate.
enum class Elem { F32, BF16 };

}  // namespace kiln::cuda

#define KILN_CUDA_CHECK(expr) ::kiln::cuda::check((expr), #expr, __FILE__, __LINE__)
/// After a kernel launch: catches bad launch configurations at once (asynchronous
/// faults surface at the next synchronising call, also as a kiln::Error).
#define KILN_CUDA_LAUNCHED(name) ::kiln::cuda::check(cudaGetLastError(), name, __FILE__, __LINE__)

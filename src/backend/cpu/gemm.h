// GEMM on the CPU through oneDNN's matmul primitive.
//
// oneDNN picks AVX-512 or AMX kernels at run time (Debian's OpenBLAS does not recognise
// this CPU family and falls back to SSE3). Primitives are cached by problem shape, and
// oneDNN runs in user-scratchpad mode so its scratch memory is allocated by kiln and
// counted as Temporaries.
#pragma once

#include "core/allocator.h"
#include "core/dtype.h"

#include <cstdint>
#include <memory>

namespace kiln::cpu {

/// One matmul problem: C[M,N] (+)= op(A)[M,K] @ op(B)[K,N] (+ bias[N]).
/// op(A) = A stored [M,K] with row stride lda, or A^T when trans_a (A stored [K,M]).
/// op(B) = B stored [K,N] with row stride ldb, or B^T when trans_b (B stored [N,K]).
/// accumulate: C += result (beta = 1) instead of C = result. Accumulation is fp32.
struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  bool trans_a = false;
  const void* b = nullptr;
  int64_t ldb = 0;
  bool trans_b = false;
  void* c = nullptr;
  int64_t ldc = 0;
  const void* bias = nullptr;  // [N] or nullptr
  bool accumulate = false;
  DType a_type = DType::F32, b_type = DType::F32, c_type = DType::F32, bias_type = DType::F32;
};

/// Runs GEMMs with cached oneDNN primitives. Not thread-safe: one per backend.
class Gemm {
 public:
  /// Scratch memory comes from `alloc` as Temporaries.
  explicit Gemm(Allocator& alloc);
  ~Gemm();
  /// Throws kiln::Error on an invalid problem or a oneDNN failure.
  void run(const GemmArgs& args);
  /// Bytes of oneDNN scratchpad run(args) would allocate, with the calling thread's
  /// OpenMP thread count (the memory planner asks this without running anything).
  static size_t scratchpad_bytes(const GemmArgs& args);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cpu

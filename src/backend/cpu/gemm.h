// GEMM on the CPU through oneDNN's matmul primitive.
//
// oneDNN picks AVX2, AVX-512 or AMX kernels at run time. Primitives are cached by problem
// shape, and oneDNN runs in user-scratchpad mode so its scratch memory is allocated by
// kiln and counted as Temporaries.
//
// Low precision (bf16, fp16) takes one of two paths, decided per problem from what
// oneDNN can create, never from a list of CPU names:
//   native        oneDNN has an optimised (non-reference) kernel for the dtypes: the
//                 operands are read as they are (AVX512-BF16, AMX, AVX512-FP16).
//   fp32 compute  it has none (Debian's oneDNN 2.6 has no bf16 matmul for AVX2 CPUs, and
//                 fp16 only on CPUs with AVX512-FP16): A, B and the bias are widened to
//                 fp32 (exact), multiplied by the fp32 kernel, and C is rounded to its
//                 dtype to nearest even (core/dtype.h), as the native kernels round their
//                 fp32 accumulators. The widened operands live in the same growing scratch
//                 buffer as oneDNN's scratchpad, so scratchpad_bytes() counts them too.
#pragma once

#include "core/allocator.h"
#include "core/dtype.h"

#include <cstdint>
#include <memory>
#include <string>

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
  /// Bytes of scratch run(args) needs (oneDNN's scratchpad, plus the widened operands on
  /// the fp32-compute path), with the calling thread's OpenMP thread count (the memory
  /// planner asks this without running anything).
  static size_t scratchpad_bytes(const GemmArgs& args);
  /// Whether GEMMs with operands of `dtype` (and C of the same dtype) run natively here.
  static bool native(DType dtype);
  /// One line for the start-up log, e.g. "bf16 GEMMs: oneDNN brg:avx512_core_amx" or
  /// "bf16 GEMMs: fp32 compute (this CPU has no bf16 matrix instructions in oneDNN 2.6)".
  static std::string path_description(DType dtype);
  /// The instruction set oneDNN dispatches to here (after DNNL_MAX_CPU_ISA), e.g. "avx2".
  static std::string isa();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cpu

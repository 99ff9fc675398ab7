// What the concrete backends allocate inside their ops, for the MetaBackend's dry runs
// (see backend/meta/meta_backend.h, MetaScratchModel).
//
//   cpu   the CPU backend's GEMM scratch: one buffer (Temporaries) kept at the largest
//         oneDNN user scratchpad any matmul primitive asked for, plus, where bf16/fp16
//         GEMMs run through fp32 compute on this CPU, their widened operands (cpu/gemm.h). For each linear call the
//         model forms the same GEMM problems as src/backend/cpu/linear.cpp (forward
//         [N,IC]x[OC,IC]^T + bias; backward dinp = dout @ W, dW += dout^T @ inp) and asks
//         oneDNN (the same library and version the CPU backend links) for the
//         scratchpad size of the primitive it would create, with `threads` OpenMP
//         threads (oneDNN sizes per-thread buffers by the thread count at creation).
//   cuda  the CUDA backend: its 32 MiB cuBLASLt workspace (kept) plus the scratch some
//         ops hold for their duration (src/backend/cuda/cuda_backend_impl.h, Scratch):
//         layernorm backward 2 ceil(N/64) C fp32, rmsnorm backward ceil(N/64) C fp32, bias gradient ceil(N/64) OC fp32,
//         attention backward B NH T fp32, embedding backward a radix sort of the B T
//         token ids (4 arrays of 4 B T bytes, each rounded to 256, plus CUB's temporary
//         storage, estimated as 8 B T + 64 KiB: an upper bound for CUB's one-sweep radix
//         sort of 32-bit keys), sum of squares 8 (blocks + 1) bytes.
//   none  nothing beyond the tensors callers allocate.
#pragma once

#include "backend/meta/meta_backend.h"

#include <cstdint>
#include <memory>
#include <string>

namespace kiln::plan {

/// One oneDNN matmul problem, as the CPU backend's Gemm builds it (see cpu/gemm.h).
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  bool trans_a = false, trans_b = false, bias = false, accumulate = false;
  DType dtype = DType::F32;    // of A, B and the bias
  DType c_dtype = DType::F32;  // of C
};

/// Bytes of scratch the CPU backend's Gemm needs for `g` (oneDNN's scratchpad, plus the
/// widened operands where bf16/fp16 run through fp32 compute), with `threads` OpenMP
/// threads (0 = this process's omp_get_max_threads()).
int64_t onednn_matmul_scratchpad_bytes(const GemmProblem& g, int threads = 0);

/// The GEMM problems the CPU backend runs for one linear call (forward, or backward
/// with the requested outputs), as cpu/linear.cpp forms them; for a grouped linear, those
/// of its largest piece (cpu/grouped_linear.cpp).
std::vector<GemmProblem> cpu_linear_gemms(const MetaCallInfo& c);

/// The CPU backend's scratch (oneDNN scratchpad); `threads` as above.
std::shared_ptr<MetaScratchModel> cpu_scratch_model(int threads = 0);
/// The CUDA backend's workspace and op scratch.
std::shared_ptr<MetaScratchModel> cuda_scratch_model();

/// The 32 MiB cuBLASLt workspace of the CUDA backend.
inline constexpr int64_t kCudaGemmWorkspaceBytes = int64_t{32} << 20;

}  // namespace kiln::plan

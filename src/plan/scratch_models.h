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
//         A grouped linear (mixture-of-experts experts) runs each expert's rows in
//         power-of-two pieces (cpu/grouped_linear.cpp), so its scratch depends on how the
//         router spreads the rows: MoeRouting below.
//   cuda  the CUDA backend: its 32 MiB cuBLASLt workspace (kept) plus the scratch some
//         ops hold for their duration (src/backend/cuda/cuda_backend_impl.h, Scratch):
//         layernorm backward 2 ceil(N/64) C fp32, rmsnorm backward ceil(N/64) C fp32, bias gradient ceil(N/64) OC fp32,
//         attention backward B NH T fp32, embedding backward a radix sort of the B T
//         token ids (4 arrays of 4 B T bytes, each rounded to 256, plus CUB's temporary
//         storage, estimated as 8 B T + 64 KiB: an upper bound for CUB's one-sweep radix
//         sort of 32-bit keys), sum of squares 8 (blocks + 1) bytes, the MoE balancing
//         statistics 16 N + 4 E bytes (N tokens, E experts), the MoE permutation plan
//         4 E ceil(N k / 256) bytes (cuda/moe_permute.cu's histogram).
//   none  nothing beyond the tensors callers allocate.
#pragma once

#include "backend/meta/meta_backend.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::plan {

/// How a mixture-of-experts layer's N tokens x k choices (M = N k rows of its grouped
/// linears) spread over its E experts, for the scratch that depends on it:
///   Worst     any spread: an expert receives from 0 to N rows (a token's k choices are k
///             distinct experts), so every power-of-two piece up to N may run
///   Balanced  each expert M / E rows (floor or ceil): the pieces of those counts
/// kiln allocates the experts' activations for all M rows whatever the routing
/// (nn::MoeScratch, the saved tensors), so only this scratch differs between the two.
enum class MoeRouting { Worst, Balanced };
/// "worst" or "balanced"; throws kiln::Error naming `what` otherwise.
MoeRouting parse_moe_routing(const std::string& name, const std::string& what);
const char* moe_routing_name(MoeRouting r);

struct MoeRoutingModel {
  MoeRouting routing = MoeRouting::Worst;
  int top_k = 1;  // k: the most rows one expert can receive is M / k = N
};

/// The row counts of the pieces a grouped linear of M rows over E experts may run under
/// `r`, largest first (powers of two).
std::vector<int64_t> grouped_linear_pieces(int64_t M, int64_t E, const MoeRoutingModel& r);

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
/// of every piece it may run under `moe` (grouped_linear_pieces).
std::vector<GemmProblem> cpu_linear_gemms(const MetaCallInfo& c, const MoeRoutingModel& moe = {});

/// The CPU backend's scratch (oneDNN scratchpad); `threads` as above, `moe` for the
/// grouped linears of a mixture of experts.
std::shared_ptr<MetaScratchModel> cpu_scratch_model(int threads = 0, MoeRoutingModel moe = {});
/// The CUDA backend's workspace and op scratch.
std::shared_ptr<MetaScratchModel> cuda_scratch_model();

/// The 32 MiB cuBLASLt workspace of the CUDA backend.
inline constexpr int64_t kCudaGemmWorkspaceBytes = int64_t{32} << 20;

}  // namespace kiln::plan

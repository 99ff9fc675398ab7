// The CUDA backend: kiln's Backend interface on one NVIDIA GPU (docs/cuda.md).
//
// - Stream: Stream::handle is a cudaStream_t; a null handle means the backend's own
//   (non-blocking) stream, which default_stream() returns. Ops are asynchronous;
//   copy_to_host and sum_squares synchronise.
// - Memory: CudaAllocator (stream-ordered cudaMallocAsync from a pool that keeps freed
//   memory), every byte accounted by MemCategory; op scratch is Temporaries.
// - dtypes: every op runs fp32 and bf16 (reductions, softmax and GEMM accumulation in
//   fp32); fp16 only for transfers, copy and fill.
// - GEMMs: cuBLASLt, fp32 without TF32 unless BackendOptions::tf32 (backend.tf32) is set
//   (then fp32 GEMMs use TF32 tensor cores: faster, ~1e-3 relative error).
// - Out-of-range token ids, positions or targets do not throw (that would need a host
//   synchronisation per op): they produce NaN rows, which the loss then shows.
#pragma once

#include "backend/backend.h"
#include "backend/options.h"

#include <memory>
#include <string>

namespace kiln {

/// The CUDA backend's `supports` answers, known without a GPU (the Meta backend's when it
/// stands for CUDA, the tests): fp32 and bf16 (fp16 only for transfers, copy and fill,
/// which are not ops of the list, and copy_columns, a copy); the ops whose tensors have
/// fixed dtypes (int32 ids, fp32 or fp64 statistics: the mixture-of-experts router, its
/// balancing statistics and the permutation plan among them) for every float dtype; the
/// varlen attention (data.packing) and ring attention's tile ops (parallel.cp > 1) in
/// fp32 and bf16 like the whole-sequence attention.
constexpr bool cuda_supports(Op op, DType dtype) {
  const bool fp32_or_bf16 = dtype == DType::F32 || dtype == DType::BF16;
  switch (op) {
    case Op::CopyColumns:
    case Op::ShardIds:
    case Op::CrossEntropyShardCombine:
    case Op::AccumulateLoss:
    case Op::ClipCoefficient:
    case Op::RectifiedFlowInputs:
    case Op::MoeRouterForward:
    case Op::MoeRouterBackward:
    case Op::MoeBalanceStats:
    case Op::MoeBalanceBackward:
    case Op::MoePermutePlan: return fp32_or_bf16 || dtype == DType::F16;
    default: return fp32_or_bf16;
  }
}

/// Number of CUDA devices visible (0 when the driver is missing or reports none).
int cuda_device_count();
/// Why no CUDA device can be used, or "" when one can ("no GPU visible", a driver error).
std::string cuda_unavailable_reason();

/// A CUDA backend on device `device`, computing as `options` say (TF32, GEMM tuning, the
/// attention kernels). Throws kiln::Error when it cannot be created, or naming
/// KILN_CUDA_GEMM_CACHE when tuning and that file cannot be parsed.
std::unique_ptr<Backend> make_cuda_backend(int device = 0, const BackendOptions& options = {});

}  // namespace kiln

// The CPU backend: OpenMP threads over rows/heads, GEMMs through oneDNN (which detects
// AVX-512 and AMX at run time), everything else as plain C++ loops the compiler
// vectorises. Ops complete before they return; the Stream argument is unused.
#pragma once

#include "backend/backend.h"

#include <memory>

namespace kiln {

/// The CPU backend's `supports` answers (also the Meta backend's when it stands for the
/// CPU): every op runs with fp32, bf16 and fp16 (bf16/fp16 GEMMs natively or through
/// fp32, see Backend::gemm_path; ops whose tensors have fixed dtypes, such as the MoE
/// router's fp32 logits and the permutation plan's int32 ids, for every float dtype), but
/// adamw_step, which updates fp32 parameters only (low-precision ones are updated through
/// their fp32 master weights: adamw_multi_step), and the fp8 linear, whose quantized
/// operands are exact in fp32 and bf16 only.
constexpr bool cpu_supports(Op op, DType dtype) {
  if (op == Op::AdamW) return dtype == DType::F32;
  if (op == Op::Fp8LinearForward || op == Op::Fp8LinearBackward)
    return dtype == DType::F32 || dtype == DType::BF16;
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16;
}

/// A new CPU backend using the process's OpenMP thread count.
std::unique_ptr<Backend> make_cpu_backend();

}  // namespace kiln

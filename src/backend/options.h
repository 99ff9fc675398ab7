// BackendOptions: the choices a backend is made with where several computations are
// valid and they may round differently (the [backend] config keys, docs/config.md). A
// backend reads them once, when it is made (make_backend, backend/registry.h); nothing
// below it reads the environment for them. The defaults are the exact, reproducible
// paths. The CPU backend has no such choices and ignores them.
#pragma once

#include <cstdint>

namespace kiln {

/// Which attention kernels run (backend.attention).
enum class AttentionKernel : uint8_t {
  Auto,  // the fastest that applies: CUDA's tensor-core kernels for bf16 without dropout
         // and head sizes 32, 64 or 128, its fp32 CUDA-core (SIMT) kernels otherwise
  Simt,  // CUDA's CUDA-core kernels always (a reference for the tensor-core ones)
};

struct BackendOptions {
  bool tf32 = false;         // CUDA: fp32 GEMMs may use TF32 tensor cores (~1e-3 relative)
  bool gemm_tuning = false;  // CUDA: each GEMM shape's algorithm is the fastest of those
                             // timed once (runs may round differently unless the choices
                             // are kept in KILN_CUDA_GEMM_CACHE), not the heuristic's first
  AttentionKernel attention = AttentionKernel::Auto;
};

}  // namespace kiln

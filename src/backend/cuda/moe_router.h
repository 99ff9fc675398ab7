// The mixture-of-experts router's kernels (Backend::moe_router_forward / _backward) and
// the load-balancing statistics and their gradients (moe_balance_stats / _backward), the
// CPU's math (src/backend/cpu/moe_router.cpp) with one warp per token. All tensors fp32
// except the int32 expert ids; `sigmoid` selects MoeScoring::Sigmoid.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// scores [N,E], expert_idx [N,k], expert_weight [N,k] from logits [N,E] and bias [E]
/// (nullptr: none), as Backend::moe_router_forward (top k of score + bias, ties and NaN
/// as the CPU's strict scan: the lower index wins). Throws kiln::Error when E is too
/// large for the kernel's shared memory (E > 9830; 5 E bytes per token).
void moe_router_forward(cudaStream_t s, float* scores, int32_t* expert_idx, float* expert_weight,
                        const float* logits, const float* bias, int64_t N, int64_t E, int k,
                        bool sigmoid, bool renormalize);
/// dlogits [N,E] (overwritten) from dexpert_weight [N,k], dscores [N,E] (nullptr: none),
/// forward's scores and expert_idx. An expert id outside [0, E) adds nothing. Throws
/// kiln::Error when E > 12288 (4 E bytes of shared memory per token).
void moe_router_backward(cudaStream_t s, float* dlogits, const float* dexpert_weight,
                         const float* dscores, const float* scores, const int32_t* expert_idx,
                         int64_t N, int64_t E, int k, bool sigmoid, bool renormalize);

/// Device scratch bytes moe_balance_stats needs.
size_t moe_balance_scratch_bytes(int64_t N, int64_t E);
/// load [E], prob [E], z [1] += as Backend::moe_balance_stats (each may be nullptr); sums
/// in double in a fixed order (no float atomics: bitwise reproducible), added once. An
/// expert id outside [0, E) is counted nowhere.
void moe_balance_stats(cudaStream_t s, float* load, float* prob, float* z, const float* logits,
                       const int32_t* expert_idx, int64_t N, int64_t E, int64_t k, bool sigmoid,
                       float prob_scale, float z_scale, void* scratch);
/// dlogits [N,E] += the balancing losses' gradient, as Backend::moe_balance_backward
/// (load nullptr: no aux term).
void moe_balance_backward(cudaStream_t s, float* dlogits, const float* logits, const float* load,
                          int64_t N, int64_t E, bool sigmoid, float aux_scale, float z_scale);

}  // namespace kiln::cuda

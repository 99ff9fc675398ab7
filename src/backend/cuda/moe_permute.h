// The token permutation of a mixture of experts on the GPU (Backend::moe_permute_plan,
// moe_permute / _backward, moe_unpermute / _backward): the plan as a deterministic
// device-side counting sort, and gathers / scatters of rows. rows and offsets as the
// Backend's (int32; -1 marks a dropped slot); activations fp32 or bf16 (Elem).
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// Device scratch bytes moe_permute_plan needs for M = N k slots of E experts.
size_t moe_plan_scratch_bytes(int64_t M, int64_t E);
/// offsets [E+1] and rows [M] (M = N k slots in (token, choice) order) from expert_idx
/// [M], each expert keeping its first `capacity` slots (0: all), exactly the CPU's
/// integers. A slot whose expert id is outside [0, E) is dropped (row -1) and counted
/// nowhere (no host synchronisation to throw; the router never writes one).
void moe_permute_plan(cudaStream_t s, int32_t* offsets, int32_t* rows, const int32_t* expert_idx,
                      int64_t M, int64_t E, int64_t capacity, void* scratch);

/// dst[rows[n,j]] = src[n] (w nullptr) or w[n,j] * src[n] (rounded once to the element
/// type) for every kept slot: src [N,C], dst [N k, C]; other rows of dst untouched.
void moe_scatter_rows(cudaStream_t s, Elem e, void* dst, const void* src, const float* w,
                      const int32_t* rows, int64_t N, int64_t k, int64_t C);
/// dst[n] (overwritten) = sum over the kept j, in choice order, of (w[n,j] or 1) *
/// src[rows[n,j]], in fp32: src [N k, C], dst [N,C]; 0 for a token without kept slots.
void moe_gather_rows(cudaStream_t s, Elem e, void* dst, const void* src, const float* w,
                     const int32_t* rows, int64_t N, int64_t k, int64_t C);
/// dw[n,j] (fp32, overwritten) = dout[n] . src[rows[n,j]] (an fp32 dot product), 0 for a
/// dropped slot: dout [N,C], src [N k, C].
void moe_row_dots(cudaStream_t s, Elem e, float* dw, const void* dout, const void* src,
                  const int32_t* rows, int64_t N, int64_t k, int64_t C);

}  // namespace kiln::cuda

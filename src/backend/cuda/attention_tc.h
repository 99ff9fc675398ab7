// Tensor-core attention for bf16, causal or bidirectional, multi-head or grouped-query
// (FlashAttention-2 structure, mma.sync m16n8k16 bf16 with fp32 accumulation; see
// attention_tc.cu). Used by attention.cu when it applies; otherwise attention.cu's fp32
// CUDA-core kernels run.
#pragma once

#include "backend/cuda/attention.h"

#include <initializer_list>

namespace kiln::cuda {

/// True when the tensor-core kernels handle this call: bf16, no dropout, HD of 32, 64
/// or 128, 16-byte aligned pointers.
bool attention_tc_applies(Elem e, const AttnShape& d, const AttnDropout& drop,
                          std::initializer_list<const void*> ptrs);

/// win: with documents (d.cu_seqlens), each row's document window int2 [B*T] on the
/// device ([lo, hi): positions in its sequence; attention.cu's attn_doc_windows), else
/// nullptr.
void attention_tc_forward(cudaStream_t s, void* out, float* lse, const void* qkv,
                          const AttnShape& d, const int2* win);
/// Dvec: fp32 [B,NH,T] scratch (attention_backward_scratch_bytes); win as above.
void attention_tc_backward(cudaStream_t s, void* dqkv, const void* dout, const void* qkv,
                           const void* out, const float* lse, const AttnShape& d,
                           float* Dvec, const int2* win);

}  // namespace kiln::cuda

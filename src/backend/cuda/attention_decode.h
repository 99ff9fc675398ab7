// Attention over a KV cache for inference (no dropout, nothing saved).
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// Writes the Tq new keys/values of qkv [B,Tq,3C] into rows past.. of k_cache/v_cache
/// [B,Tmax,C], then out [B,Tq,C] = causal attention of each new query over cache rows
/// [0, past + t]. Throws when the scores of one row do not fit in shared memory.
void attention_decode(cudaStream_t s, Elem e, void* out, void* k_cache, void* v_cache,
                      const void* qkv, int64_t B, int64_t Tq, int64_t Tmax, int64_t C, int64_t NH,
                      int64_t past);

}  // namespace kiln::cuda

// Attention over a KV cache for inference (no dropout, nothing saved).
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// Writes the Tq new keys/values of qkv [B,Tq,(NH+2NKV)*HD] into rows past.. of
/// k_cache/v_cache [B,Tmax,NKV*HD], then out [B,Tq,NH*HD] = causal attention of each new
/// query (head h) over rows [0, past + t] of cache head h / (NH / NKV). Throws when the
/// scores of one row do not fit in shared memory.
void attention_decode(cudaStream_t s, Elem e, void* out, void* k_cache, void* v_cache,
                      const void* qkv, int64_t B, int64_t Tq, int64_t Tmax, int64_t NH,
                      int64_t NKV, int64_t HD, int64_t past);

}  // namespace kiln::cuda

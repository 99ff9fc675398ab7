// DiT's adaLN modulation and gate (Backend::modulate / modulate_backward).
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// out[b,t,c] = x[b,t,c] * (scale_offset + mod[b,scale,c]) + (shift >= 0 ? mod[b,shift,c] : 0);
/// x, out [B,T,C], mod [B,M,C] of element type e. out may alias x.
void modulate(cudaStream_t s, Elem e, void* out, const void* x, const void* mod, int64_t B,
              int64_t T, int64_t C, int64_t M, int64_t scale, int64_t shift, float scale_offset);
/// dx = dout * (scale_offset + scale chunk) (dx nullptr: skipped; may alias dout); the scale
/// (and shift) chunks of dmod overwritten with sum_t dout * x (and sum_t dout).
void modulate_backward(cudaStream_t s, Elem e, void* dx, void* dmod, const void* dout,
                       const void* x, const void* mod, int64_t B, int64_t T, int64_t C, int64_t M,
                       int64_t scale, int64_t shift, float scale_offset);

}  // namespace kiln::cuda

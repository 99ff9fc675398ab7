// Token (+ learned position) embedding, forward and a deterministic backward.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// out[b,t,:] = wte[tokens[b,t],:] + wpe[pos[b,t],:], pos[b,t] = positions[b,t] when
/// positions is given, else t; without wpe (null) out[b,t,:] = wte[tokens[b,t],:]. A token
/// of -1 reads a zero wte row (vocab-parallel: another rank holds it). Rows with a token
/// outside [-1, Vp) or a position outside [0, maxT) are written as NaN (a device-side
/// check cannot throw without a host synchronisation).
void embedding_forward(cudaStream_t s, Elem e, void* out, const int32_t* tokens,
                       const int32_t* positions, const void* wte, const void* wpe, int64_t B,
                       int64_t T, int64_t C, int64_t Vp, int64_t maxT);

/// Device scratch bytes embedding_backward needs for B*T tokens.
size_t embedding_backward_scratch_bytes(int64_t BT);
/// dwte[tokens[b,t]] += dout[b,t];  dwpe[pos[b,t]] += dout[b,t] when dwpe is given (null:
/// no position table). Tokens outside [0, Vp) and positions outside [0, maxT) are
/// skipped (as on the CPU). dout is of element type e, dwte and dwpe of g (fp32
/// gradients of bf16 parameters, or e).
void embedding_backward(cudaStream_t s, Elem e, Elem g, void* dwte, void* dwpe, const void* dout,
                        const int32_t* tokens, const int32_t* positions, int64_t B, int64_t T,
                        int64_t C, int64_t Vp, int64_t maxT, void* scratch,
                        size_t scratch_bytes);

/// Backend::shard_ids: out[i] = ids[i] - begin inside [begin, begin + count), else -1.
void shard_ids(cudaStream_t s, int32_t* out, const int32_t* ids, int64_t n, int64_t begin,
               int64_t count);

}  // namespace kiln::cuda

// One tile of a blockwise (ring) attention on the GPU (Backend::attention_tile_forward and
// attention_tile_backward): the query rows of a tile of qkv against the key/value rows of
// a tile of a separate kv buffer, merged into fp32 running results (forward) or
// accumulated into fp32 gradients (backward). fp32 CUDA-core kernels; HD <= 128.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// The buffers and the tile. qkv [B,T,(NH+2NKV)*HD] (q heads, k heads, v heads), kv
/// [B,Tk,2*NKV*HD] (k heads, v heads); the tile's queries are rows [q_begin, +q_len) of
/// qkv, its keys rows [k_begin, +k_len) of kv. causal: a diagonal tile (q_len == k_len,
/// query i sees the tile's keys 0..i); otherwise every key of the tile. Documents
/// (cu_seqlens not null): int32 [cu_count] on the device, the cumulative document lengths
/// over B sequences of seq_len tokens laid end to end; the tile's queries sit at
/// positions q_pos.. and its keys at k_pos.. of each sequence, and a query sees only the
/// keys of its own document (cut at its sequence's ends), as cpu::key_windows.
struct TileShape {
  int64_t B, T, Tk, NH, NKV, HD;
  int64_t q_begin, q_len, k_begin, k_len;
  bool causal = false;
  const int32_t* cu_seqlens = nullptr;
  int64_t cu_count = 0;
  int64_t seq_len = 0, q_pos = 0, k_pos = 0;
};

/// out_acc fp32 [B,T,NH*HD] and lse fp32 [B,NH,T] (the attention over the keys merged so
/// far: 0 and -inf at first) take in the tile: for each query row that sees a key of the
/// tile, with o', l' the tile's own softmax output and log-sum-exp,
///   lse' = log(e^lse + e^l'), out <- e^(lse - lse') out + e^(l' - lse') o'.
/// Rows that see no key of the tile are left as they were. qkv and kv of element type e.
void attention_tile_forward(cudaStream_t s, Elem e, float* out_acc, float* lse, const void* qkv,
                            const void* kv, const TileShape& t);

/// dq fp32 [B,T,NH*HD] += dL/dq of the tile's query rows, dkv fp32 [B,Tk,2*NKV*HD] +=
/// dL/dk, dL/dv of its key rows, from dout and out [B,T,NH*HD] (element type e) and lse
/// fp32 [B,NH,T]: the final output and log-sum-exp over every key. Deterministic: no
/// atomics, each gradient element has one owning thread that adds the tile's sum, summed
/// in a fixed order.
void attention_tile_backward(cudaStream_t s, Elem e, float* dq, float* dkv, const void* dout,
                             const void* qkv, const void* kv, const void* out, const float* lse,
                             const TileShape& t);

}  // namespace kiln::cuda

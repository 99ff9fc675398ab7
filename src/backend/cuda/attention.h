// Self-attention on packed qkv [B,T,(NH+2NKV)*HD] (causal or bidirectional, multi-head
// or grouped-query; see AttentionShape in backend/backend.h), FlashAttention style:
// forward keeps only the row log-sum-exp; backward recomputes the probabilities. No
// [T,T] matrix is ever stored. Head size HD <= 128. With documents (AttnShape::cu_seqlens:
// Backend::attention_varlen_forward) a query also sees only its document's keys.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// NH query heads, NKV key/value heads (NH % NKV == 0; query head h reads kv head
/// h / (NH / NKV)), head size HD. qkv rows hold W() columns: q heads, k heads, v heads;
/// out rows hold NH*HD.
struct AttnShape {
  int64_t B, T, NH, NKV, HD;
  bool causal = true;
  /// Documents packed into the sequences: int32 [cu_count] on the device, the cumulative
  /// document lengths over the B*T rows laid end to end (Backend::attention_varlen_forward).
  /// Query t then sees only the keys of its document (cut at its sequence's ends), causal:
  /// those not after t. nullptr: no documents (the whole sequence, or its causal prefix).
  const int32_t* cu_seqlens = nullptr;
  int64_t cu_count = 0;
  int64_t W() const { return (NH + 2 * NKV) * HD; }
  int64_t CQ() const { return NH * HD; }
};
struct AttnDropout {
  float p = 0.f;      // 0: off
  float scale = 1.f;  // 1/(1-p)
  uint64_t seed = 0, stream = 0;
  uint64_t offset = 0;                   // DropoutSpec::offset, added to every index
  int head_offset = 0, total_heads = 0;  // DropoutSpec's global heads (0: the op's own)
};

/// Largest head size the kernels handle.
inline constexpr int64_t kMaxHeadDim = 128;

/// Device scratch bytes attention_forward needs: with documents, each row's key window
/// (int32 pairs [B*T]); none without.
size_t attention_forward_scratch_bytes(const AttnShape& d);
/// simt: the fp32 CUDA-core kernels even where the tensor-core ones apply
/// (BackendOptions::attention); else those when attention_tc_applies. scratch:
/// attention_forward_scratch_bytes(d) on the device (may be null without documents).
void attention_forward(cudaStream_t s, Elem e, void* out, float* lse, const void* qkv,
                       const AttnShape& d, const AttnDropout& drop, void* scratch, bool simt);

/// Device scratch bytes attention_backward needs: D_i = dO_i . O_i (fp32 [B,NH,T]) and,
/// with documents, the key windows (int32 pairs [B*T]) from a 256-byte boundary on.
size_t attention_backward_scratch_bytes(const AttnShape& d);
void attention_backward(cudaStream_t s, Elem e, void* dqkv, const void* dout, const void* qkv,
                        const void* out, const float* lse, const AttnShape& d,
                        const AttnDropout& drop, void* scratch, bool simt);

}  // namespace kiln::cuda

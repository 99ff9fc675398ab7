// Causal multi-head attention on packed qkv [B,T,3C], FlashAttention style: forward
// keeps only the row log-sum-exp; backward recomputes the probabilities. No [T,T]
// matrix is ever stored. Head size HD <= 128.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

struct AttnShape {
  int64_t B, T, C, NH, HD;
};
struct AttnDropout {
  float p = 0.f;      // 0: off
  float scale = 1.f;  // 1/(1-p)
  uint64_t seed = 0, stream = 0;
};

/// Largest head size the kernels handle.
inline constexpr int64_t kMaxHeadDim = 128;

void attention_forward(cudaStream_t s, Elem e, void* out, float* lse, const void* qkv,
                       const AttnShape& d, const AttnDropout& drop);

/// Device scratch bytes attention_backward needs (D_i = dO_i . O_i, fp32 [B,NH,T]).
size_t attention_backward_scratch_bytes(const AttnShape& d);
void attention_backward(cudaStream_t s, Elem e, void* dqkv, const void* dout, const void* qkv,
                        const void* out, const float* lse, const AttnShape& d,
                        const AttnDropout& drop, void* scratch);

}  // namespace kiln::cuda

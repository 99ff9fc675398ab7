// Softmax cross-entropy over the first V of Vp columns (padding never enters the
// softmax), with the loss gradient written in place or into a separate buffer.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

/// losses[n] = logsumexp(x[n,:V]) - x[n,target]; 0 for ignored rows; NaN for a target
/// outside [0, V) that is not the ignore index (no host synchronisation to throw).
/// dlogits (nullptr: skipped; may alias logits) = grad_scale (softmax - onehot), 0 in
/// padded columns and ignored rows.
void softmax_cross_entropy(cudaStream_t s, Elem e, float* losses, void* dlogits,
                           const void* logits, const int32_t* targets, int64_t N, int64_t Vp,
                           int V, int ignore_index, float grad_scale);

/// Vocab-parallel cross-entropy (Backend::cross_entropy_shard_stats / _backward): stats
/// fp32 [N,3] per row of one rank's logits [N,Vl]; then dlogits from the combined lse.
void cross_entropy_shard_stats(cudaStream_t s, Elem e, float* stats, const void* logits,
                               const int32_t* targets, int64_t N, int64_t Vl,
                               int64_t vocab_begin, int valid);
void cross_entropy_shard_backward(cudaStream_t s, Elem e, void* dlogits, const void* logits,
                                  const int32_t* targets, const float* lse, int64_t N,
                                  int64_t Vl, int64_t vocab_begin, int valid, int ignore_index,
                                  float grad_scale);

}  // namespace kiln::cuda

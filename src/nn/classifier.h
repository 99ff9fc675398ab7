// The output projection (tied to the token embedding) fused with softmax cross-entropy,
// over chunks of rows, so that the [N, Vp] logits and their gradient never exist whole:
// only one [rows, Vp] chunk does, and its gradient overwrites it in place. This is what
// llm.c and Liger-Kernel's fused linear cross-entropy do to save the largest activation.
#pragma once

#include "backend/backend.h"

namespace kiln::nn {

/// Rows per chunk such that one chunk of fp32 logits is at most ~16 MiB (>= 1).
int64_t classifier_chunk_rows(int64_t n_rows, int64_t padded_vocab);

struct ClassifierLoss {
  double loss_sum = 0.0;  // sum over non-ignored rows of the per-row loss, nats
  int64_t n_targets = 0;  // rows whose target is not ignore_index
};

/// x [N,C] hidden states, wte [Vp,C], targets int32 [N] (ignore_index = -1 ignored),
/// logits_chunk [R,Vp] and losses_chunk fp32 [R] scratch with R = classifier_chunk_rows.
/// When dx is given: dx [N,C] = d(grad_scale * loss_sum)/dx (overwritten) and
/// dwte [Vp,C] += d(grad_scale * loss_sum)/dwte. The loss sum is added on the host in
/// row order (deterministic).
ClassifierLoss classifier_cross_entropy(Backend& be, Stream s, const Tensor& x, const Tensor& wte,
                                        const Tensor& targets, int vocab_size, float grad_scale,
                                        const Tensor& dx, const Tensor& dwte,
                                        const Tensor& logits_chunk, const Tensor& losses_chunk);

}  // namespace kiln::nn

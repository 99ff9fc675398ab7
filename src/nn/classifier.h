// The output projection (tied to the token embedding) fused with softmax cross-entropy,
// over chunks of rows, so that the [N, Vp] logits and their gradient never exist whole:
// only one [rows, Vp] chunk does, and its gradient overwrites it in place. This is what
// llm.c and Liger-Kernel's fused linear cross-entropy do to save the largest activation.
#pragma once

#include "backend/backend.h"
#include "nn/tensor_parallel.h"

namespace kiln::nn {

/// The chunk of fp32 logits in MiB when nothing else is given (train.classifier_chunk_mb's
/// default, ModelStorage::classifier_chunk_mb's).
inline constexpr double kDefaultClassifierChunkMb = 16.0;

/// Rows per chunk (>= 1, <= n_rows) such that one chunk of fp32 logits [rows,
/// padded_vocab] is at most `chunk_mb` MiB (train.classifier_chunk_mb, which the model
/// receives in ModelStorage; larger chunks: fewer passes over the head's weight and its
/// gradient, more activation memory). Throws kiln::Error naming train.classifier_chunk_mb
/// when chunk_mb is not a positive number.
int64_t classifier_chunk_rows(int64_t n_rows, int64_t padded_vocab, double chunk_mb);

/// x [N,C] hidden states, wte [Vp,C], targets int32 [N] (ignore_index = -1 ignored),
/// logits_chunk [R,Vp] and losses_chunk fp32 [R] scratch with R = classifier_chunk_rows.
/// loss fp64 [2] on the device: loss[0] += the sum over non-ignored rows of the per-row
/// loss (nats), loss[1] += their number (Backend::accumulate_loss per chunk, in chunk
/// order: deterministic); nothing is read back to the host. When dx is given: dx [N,C] =
/// d(grad_scale * loss_sum)/dx (overwritten) and dwte [Vp,C] += d(grad_scale *
/// loss_sum)/dwte.
void classifier_cross_entropy(Backend& be, Stream s, const Tensor& x, const Tensor& wte,
                              const Tensor& targets, int vocab_size, float grad_scale,
                              const Tensor& dx, const Tensor& dwte, const Tensor& logits_chunk,
                              const Tensor& losses_chunk, const Tensor& loss);

/// Scratch of the vocab-parallel form: stats fp32 [(tp + 1) R, 3] (this rank's R rows of
/// statistics, then every rank's); x_full and dx_full [N, C] in the model dtype with
/// sequence parallelism (the gathered input and the partial input gradient), else empty.
struct VocabParallelScratch {
  Tensor stats, x_full, dx_full;
};

/// The vocab-parallel form (Megatron-LM's vocab_parallel_cross_entropy): wte [Vp/tp, C] is
/// this tp rank's rows of the tied table (placement.group's rank r holds rows [r Vp/tp,
/// (r+1) Vp/tp)), logits_chunk [R, Vp/tp]: no rank ever holds more than its share of the
/// logits. x is [N, C] on every rank (copy_to_tp) or, with placement.sequence_parallel,
/// the rank's [N/tp, C] rows, gathered into scratch.x_full (gather_from_sp); dx has x's
/// shape and is complete on return (all_reduce, or reduce_scatter of scratch.dx_full).
/// targets int32 [N] (global ids) are the same on every tp rank. Per chunk one all_gather
/// of the [R, 3] statistics (max, sum of exp, target logit) combines the ranks on the
/// device (Backend::cross_entropy_shard_combine, in double, in rank order): the combined
/// log-sum-exp lands in losses_chunk for the gradient, the loss sum (the same on every
/// rank) and target count in `loss` as classifier_cross_entropy's.
void vocab_parallel_cross_entropy(Backend& be, Stream s, const TpPlacement& placement,
                                  const Tensor& x, const Tensor& wte, const Tensor& targets,
                                  int vocab_size, float grad_scale, const Tensor& dx,
                                  const Tensor& dwte, const Tensor& logits_chunk,
                                  const Tensor& losses_chunk, const VocabParallelScratch& scratch,
                                  const Tensor& loss);

/// A language model's output end: the loss over its head weight's rows, plain (placement
/// inactive) or vocab-parallel, with its scratch for N rows.
struct HeadScratch {
  Tensor logits_chunk, losses_chunk;  // [R, Vl] in the model dtype, fp32 [R]
  VocabParallelScratch vocab;         // vocab-parallel only
};
/// Scratch for N = B*T rows of width C and a head of Vl (= its local rows) columns, in
/// chunks of classifier_chunk_rows(N, Vl, chunk_mb) rows.
HeadScratch make_head_scratch(Backend& be, const TpPlacement& placement, int64_t N, int64_t C,
                              int64_t Vl, DType dtype, double chunk_mb);
/// classifier_cross_entropy, or vocab_parallel_cross_entropy when placement is active;
/// the loss sum and target count are added to `loss` (fp64 [2], on the device).
void head_cross_entropy(Backend& be, Stream s, const TpPlacement& placement, const Tensor& x,
                        const Tensor& weight, const Tensor& targets, int vocab_size,
                        float grad_scale, const Tensor& dx, const Tensor& dweight,
                        const HeadScratch& scratch, const Tensor& loss);

}  // namespace kiln::nn

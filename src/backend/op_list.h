// The compute ops of the Backend interface, listed once, so that the backends that wrap
// or imitate another (the Meta backend's dry run, the Profiling backend's timing), the
// `Op` enum that `Backend::supports` answers for, and the tests that walk every op are
// generated from this list instead of written op by op.
//
//   KILN_BACKEND_OPS(X) calls X(Call, method, family, category, (parameters), (arguments))
//
// per op: Call names it in the `Op` enum (backend.h), `method` is the Backend method,
// `family` the `OpFamily` it belongs to (a layer's forward and backward, ring attention's
// tile ops, ...), `category` the Profiling backend's trace category, (parameters) the
// method's parameters after the Stream and (arguments) their names. The signatures are
// those declared (and documented) in backend/backend.h; a wrapper generated from this list
// overrides each method, so a mismatch with backend.h, or an op missing here, fails to
// compile. The memory ops (copy*, fill) are not in the list: each wrapper writes those by
// hand.
#pragma once

#define KILN_PARAMS(...) __VA_ARGS__

// clang-format off
#define KILN_BACKEND_OPS(X)                                                                        \
  X(EmbeddingForward, embedding_forward, Embedding, "forward",                                     \
    (const Tensor& out, const Tensor& tokens, const Tensor& positions, const Tensor& wte,          \
     const Tensor& wpe),                                                                           \
    (out, tokens, positions, wte, wpe))                                                            \
  X(EmbeddingBackward, embedding_backward, Embedding, "backward",                                  \
    (const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,             \
     const Tensor& positions),                                                                     \
    (dwte, dwpe, dout, tokens, positions))                                                         \
  X(LayerNormForward, layernorm_forward, LayerNorm, "forward",                                     \
    (const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,                 \
     const Tensor& weight, const Tensor& bias, float eps),                                         \
    (out, mean, rstd, inp, weight, bias, eps))                                                     \
  X(LayerNormBackward, layernorm_backward, LayerNorm, "backward",                                  \
    (const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,           \
     const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd),             \
    (dinp, dweight, dbias, dout, inp, weight, mean, rstd))                                         \
  X(RMSNormForward, rmsnorm_forward, RMSNorm, "forward",                                           \
    (const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,               \
     float eps),                                                                                   \
    (out, rstd, inp, weight, eps))                                                                 \
  X(RMSNormBackward, rmsnorm_backward, RMSNorm, "backward",                                        \
    (const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,             \
     const Tensor& weight, const Tensor& rstd),                                                    \
    (dinp, dweight, dout, inp, weight, rstd))                                                      \
  X(LinearForward, linear_forward, Linear, "forward",                                              \
    (const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias),              \
    (out, inp, weight, bias))                                                                      \
  X(LinearBackward, linear_backward, Linear, "backward",                                           \
    (const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,           \
     const Tensor& inp, const Tensor& weight),                                                     \
    (dinp, dweight, dbias, dout, inp, weight))                                                     \
  X(Fp8Amax, fp8_amax, Fp8, "forward", (const Tensor& amax, const Tensor& x), (amax, x))           \
  X(Fp8LinearForward, fp8_linear_forward, Fp8, "forward",                                          \
    (const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,               \
     const Tensor& amax),                                                                          \
    (out, inp, weight, bias, amax))                                                                \
  X(Fp8LinearBackward, fp8_linear_backward, Fp8, "backward",                                       \
    (const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,           \
     const Tensor& inp, const Tensor& weight, const Tensor& amax),                                 \
    (dinp, dweight, dbias, dout, inp, weight, amax))                                               \
  X(Fp8AmaxHistory, fp8_amax_history, Fp8, "optimizer",                                           \
    (const Tensor& amax, const Tensor& history, const Tensor& step_amax, int64_t slot,             \
     bool most_recent),                                                                            \
    (amax, history, step_amax, slot, most_recent))                                                 \
  X(AttentionForward, attention_forward, Attention, "forward",                                     \
    (const Tensor& out, const Tensor& lse, const Tensor& qkv, const AttentionShape& shape,         \
     const DropoutSpec& dropout),                                                                  \
    (out, lse, qkv, shape, dropout))                                                               \
  X(AttentionBackward, attention_backward, Attention, "backward",                                  \
    (const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,                 \
     const Tensor& lse, const AttentionShape& shape, const DropoutSpec& dropout),                  \
    (dqkv, dout, qkv, out, lse, shape, dropout))                                                   \
  X(AttentionVarlenForward, attention_varlen_forward, VarlenAttention, "forward",                  \
    (const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& cu_seqlens,            \
     const AttentionShape& shape, const DropoutSpec& dropout),                                     \
    (out, lse, qkv, cu_seqlens, shape, dropout))                                                   \
  X(AttentionVarlenBackward, attention_varlen_backward, VarlenAttention, "backward",               \
    (const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,                 \
     const Tensor& lse, const Tensor& cu_seqlens, const AttentionShape& shape,                     \
     const DropoutSpec& dropout),                                                                  \
    (dqkv, dout, qkv, out, lse, cu_seqlens, shape, dropout))                                       \
  X(AttentionTileForward, attention_tile_forward, RingAttention, "forward",                        \
    (const Tensor& out_acc, const Tensor& lse, const Tensor& qkv, const Tensor& kv,                \
     const Tensor& cu_seqlens, const AttentionShape& shape, const AttentionTile& tile),            \
    (out_acc, lse, qkv, kv, cu_seqlens, shape, tile))                                              \
  X(AttentionTileBackward, attention_tile_backward, RingAttention, "backward",                     \
    (const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& qkv,                   \
     const Tensor& kv, const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens,             \
     const AttentionShape& shape, const AttentionTile& tile),                                      \
    (dq, dkv, dout, qkv, kv, out, lse, cu_seqlens, shape, tile))                                   \
  X(CopyColumns, copy_columns, RingAttention, "copy",                                              \
    (const Tensor& dst, const Tensor& src, int64_t dst_col, int64_t src_col, int64_t ncols),       \
    (dst, src, dst_col, src_col, ncols))                                                           \
  X(AttentionDecode, attention_decode, Decode, "forward",                                          \
    (const Tensor& out, const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,           \
     int64_t past, const AttentionShape& shape),                                                   \
    (out, k_cache, v_cache, qkv, past, shape))                                                     \
  X(RopeForward, rope_forward, Rope, "forward",                                                    \
    (const Tensor& qkv, const Tensor& positions, const AttentionShape& shape,                      \
     const RopeSpec& rope),                                                                        \
    (qkv, positions, shape, rope))                                                                 \
  X(RopeBackward, rope_backward, Rope, "backward",                                                 \
    (const Tensor& dqkv, const Tensor& positions, const AttentionShape& shape,                     \
     const RopeSpec& rope),                                                                        \
    (dqkv, positions, shape, rope))                                                                \
  X(GeluForward, gelu_forward, Gelu, "forward",                                                    \
    (const Tensor& out, const Tensor& inp), (out, inp))                                            \
  X(GeluBackward, gelu_backward, Gelu, "backward",                                                 \
    (const Tensor& dinp, const Tensor& dout, const Tensor& inp), (dinp, dout, inp))                \
  X(SiluForward, silu_forward, Silu, "forward",                                                    \
    (const Tensor& out, const Tensor& inp), (out, inp))                                            \
  X(SiluBackward, silu_backward, Silu, "backward",                                                 \
    (const Tensor& dinp, const Tensor& dout, const Tensor& inp), (dinp, dout, inp))                \
  X(SwiGluForward, swiglu_forward, SwiGLU, "forward", (const Tensor& out, const Tensor& inp),      \
    (out, inp))                                                                                    \
  X(SwiGluBackward, swiglu_backward, SwiGLU, "backward",                                           \
    (const Tensor& dinp, const Tensor& dout, const Tensor& inp), (dinp, dout, inp))                \
  X(Add, add, Add, "forward", (const Tensor& out, const Tensor& a, const Tensor& b), (out, a, b))  \
  X(AddColumns, add_columns, Add, "forward",                                                       \
    (const Tensor& out, const Tensor& src, int64_t out_col, float alpha),                          \
    (out, src, out_col, alpha))                                                                    \
  X(Modulate, modulate, Modulate, "forward",                                                       \
    (const Tensor& out, const Tensor& x, const Tensor& mod, int scale_index, int shift_index,      \
     float scale_offset),                                                                          \
    (out, x, mod, scale_index, shift_index, scale_offset))                                         \
  X(ModulateBackward, modulate_backward, Modulate, "backward",                                     \
    (const Tensor& dx, const Tensor& dmod, const Tensor& dout, const Tensor& x,                    \
     const Tensor& mod, int scale_index, int shift_index, float scale_offset),                     \
    (dx, dmod, dout, x, mod, scale_index, shift_index, scale_offset))                              \
  X(DropoutForward, dropout_forward, Dropout, "forward",                                           \
    (const Tensor& out, const Tensor& inp, const DropoutSpec& spec), (out, inp, spec))             \
  X(DropoutBackward, dropout_backward, Dropout, "backward",                                        \
    (const Tensor& dinp, const Tensor& dout, const DropoutSpec& spec), (dinp, dout, spec))         \
  X(SoftmaxCrossEntropy, softmax_cross_entropy, SoftmaxCrossEntropy, "loss",                       \
    (const Tensor& losses, const Tensor& dlogits, const Tensor& logits,                            \
     const Tensor& targets, int vocab_size, int ignore_index, float grad_scale),                   \
    (losses, dlogits, logits, targets, vocab_size, ignore_index, grad_scale))                      \
  X(CrossEntropyShardStats, cross_entropy_shard_stats, VocabParallel, "loss",                      \
    (const Tensor& stats, const Tensor& logits, const Tensor& targets, int64_t vocab_begin,        \
     int valid),                                                                                   \
    (stats, logits, targets, vocab_begin, valid))                                                  \
  X(CrossEntropyShardBackward, cross_entropy_shard_backward, VocabParallel, "loss",                \
    (const Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,        \
     int64_t vocab_begin, int valid, int ignore_index, float grad_scale),                          \
    (dlogits, logits, targets, lse, vocab_begin, valid, ignore_index, grad_scale))                 \
  X(ShardIds, shard_ids, VocabParallel, "forward",                                                 \
    (const Tensor& out, const Tensor& ids, int64_t begin, int64_t count),                          \
    (out, ids, begin, count))                                                                      \
  X(Patchify, patchify, Patchify, "forward",                                                       \
    (const Tensor& out, const Tensor& images, int patch), (out, images, patch))                    \
  X(Unpatchify, unpatchify, Unpatchify, "forward",                                                 \
    (const Tensor& images, const Tensor& patches, int patch), (images, patches, patch))            \
  X(RectifiedFlowInputs, rectified_flow_inputs, FlowMatching, "loss",                              \
    (const Tensor& xt, const Tensor& target, const Tensor& images, const Tensor& noise,            \
     const Tensor& t),                                                                             \
    (xt, target, images, noise, t))                                                                \
  X(MseLoss, mse_loss, FlowMatching, "loss",                                                       \
    (const Tensor& losses, const Tensor& dpred, const Tensor& pred, const Tensor& target,          \
     float grad_scale),                                                                            \
    (losses, dpred, pred, target, grad_scale))                                                     \
  X(AccumulateLoss, accumulate_loss, StepStats, "loss",                                            \
    (const Tensor& acc, const Tensor& losses, const Tensor& targets), (acc, losses, targets))      \
  X(CrossEntropyShardCombine, cross_entropy_shard_combine, VocabParallel, "loss",                  \
    (const Tensor& lse, const Tensor& acc, const Tensor& stats, const Tensor& targets),            \
    (lse, acc, stats, targets))                                                                    \
  X(SumSquares, sum_squares, StepStats, "optimizer",                                               \
    (const Tensor& acc, const Tensor& x), (acc, x))                                                \
  X(ClipCoefficient, clip_coefficient, StepStats, "optimizer",                                     \
    (const Tensor& coef, const Tensor& sumsq, const Tensor& check, double max_norm,                \
     float loss_scale),                                                                            \
    (coef, sumsq, check, max_norm, loss_scale))                                                    \
  X(AdamW, adamw_step, AdamW, "optimizer",                                                         \
    (const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,                    \
     const Tensor& scale, const AdamWParams& hp),                                                  \
    (param, grad, m, v, scale, hp))                                                                \
  X(AdamWMulti, adamw_multi_step, AdamW, "optimizer",                                              \
    (std::span<const AdamWTensor> tensors, const Tensor& scale, const AdamWParams& hp),            \
    (tensors, scale, hp))                                                                          \
  X(Ema, ema_update, Ema, "optimizer",                                                             \
    (const Tensor& ema, const Tensor& param, float decay), (ema, param, decay))                    \
  X(MoeRouterForward, moe_router_forward, MoE, "forward",                                          \
    (const Tensor& scores, const Tensor& expert_idx, const Tensor& expert_weight,                  \
     const Tensor& logits, const Tensor& bias, const MoeRouterSpec& spec),                         \
    (scores, expert_idx, expert_weight, logits, bias, spec))                                       \
  X(MoeRouterBackward, moe_router_backward, MoE, "backward",                                       \
    (const Tensor& dlogits, const Tensor& dexpert_weight, const Tensor& dscores,                   \
     const Tensor& scores, const Tensor& expert_idx, const MoeRouterSpec& spec),                   \
    (dlogits, dexpert_weight, dscores, scores, expert_idx, spec))                                  \
  X(MoeBalanceStats, moe_balance_stats, MoE, "forward",                                           \
    (const Tensor& load, const Tensor& prob, const Tensor& z, const Tensor& logits,                \
     const Tensor& expert_idx, MoeScoring scoring, float prob_scale, float z_scale),               \
    (load, prob, z, logits, expert_idx, scoring, prob_scale, z_scale))                             \
  X(MoeBalanceBackward, moe_balance_backward, MoE, "backward",                                     \
    (const Tensor& dlogits, const Tensor& logits, const Tensor& load, MoeScoring scoring,          \
     float aux_scale, float z_scale),                                                              \
    (dlogits, logits, load, scoring, aux_scale, z_scale))                                          \
  X(MoePermutePlan, moe_permute_plan, MoE, "forward",                                              \
    (const Tensor& offsets, const Tensor& rows, const Tensor& expert_idx, int64_t capacity),       \
    (offsets, rows, expert_idx, capacity))                                                         \
  X(MoePermute, moe_permute, MoE, "forward",                                                       \
    (const Tensor& out, const Tensor& inp, const Tensor& rows),                                    \
    (out, inp, rows))                                                                              \
  X(MoePermuteBackward, moe_permute_backward, MoE, "backward",                                     \
    (const Tensor& dinp, const Tensor& dout, const Tensor& rows),                                  \
    (dinp, dout, rows))                                                                            \
  X(MoeUnpermute, moe_unpermute, MoE, "forward",                                                   \
    (const Tensor& out, const Tensor& expert_out, const Tensor& expert_weight,                     \
     const Tensor& rows),                                                                          \
    (out, expert_out, expert_weight, rows))                                                        \
  X(MoeUnpermuteBackward, moe_unpermute_backward, MoE, "backward",                                 \
    (const Tensor& dexpert_out, const Tensor& dexpert_weight, const Tensor& dout,                  \
     const Tensor& expert_out, const Tensor& expert_weight, const Tensor& rows),                   \
    (dexpert_out, dexpert_weight, dout, expert_out, expert_weight, rows))                          \
  X(GroupedLinearForward, grouped_linear_forward, MoE, "forward",                                  \
    (const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& offsets),           \
    (out, inp, weight, offsets))                                                                   \
  X(GroupedLinearBackward, grouped_linear_backward, MoE, "backward",                               \
    (const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,             \
     const Tensor& weight, const Tensor& offsets),                                                 \
    (dinp, dweight, dout, inp, weight, offsets))
// clang-format on

// Shape and dtype validation shared by every backend, so that each op's contract is
// checked in one place and every backend rejects bad arguments with the same message.
// Each function throws kiln::Error naming the op and the argument at fault, and returns
// the sizes the kernels need.
#pragma once

#include "backend/backend.h"

namespace kiln::checks {

/// maxT = 0 without a position table.
struct EmbeddingDims { int64_t B, T, C, Vp, maxT; };
EmbeddingDims embedding(const Tensor& out, const Tensor& tokens, const Tensor& positions,
                        const Tensor& wte, const Tensor& wpe);

/// positions: empty, or int32 [B,T].
void positions(const Tensor& positions, int64_t B, int64_t T, const char* op);

struct RowDims { int64_t N, C; };
RowDims layernorm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                  const Tensor& weight, const Tensor& bias);

/// layernorm_backward's arguments (the forward's plus dinp like inp, dweight a gradient
/// of weight).
RowDims layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                           const Tensor& dout, const Tensor& inp, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd);

RowDims rmsnorm(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight);
RowDims rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                         const Tensor& inp, const Tensor& weight, const Tensor& rstd);

/// out/dout [N,H], inp/dinp [N,2H].
struct GluDims { int64_t N, H; };
GluDims swiglu(const Tensor& out, const Tensor& inp);

struct LinearDims { int64_t N, IC, OC; };
/// out/dout [N,OC], inp [N,IC], weight [OC,IC], bias [OC] or empty. Leading dims of
/// out and inp are flattened into N.
LinearDims linear(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias);

/// fp8_amax: amax fp32 [1]; x fp32, bf16 or fp16.
void fp8_amax(const Tensor& amax, const Tensor& x);
/// fp8_linear_forward: linear's arguments with inp fp32 or bf16 and amax fp32 [3].
LinearDims fp8_linear(const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias, const Tensor& amax);
/// fp8_linear_backward: linear_backward's arguments with inp fp32 or bf16, amax fp32 [3].
LinearDims fp8_linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                               const Tensor& dout, const Tensor& inp, const Tensor& weight,
                               const Tensor& amax);
/// fp8_amax_history: history fp32 [n,H,k], amax and step_amax fp32 [n,k], 0 <= slot < H.
void fp8_amax_history(const Tensor& amax, const Tensor& history, const Tensor& step_amax,
                      int64_t slot);
/// linear_backward's arguments; dinp, dweight and dbias may each be empty.
LinearDims linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                           const Tensor& dout, const Tensor& inp, const Tensor& weight);

/// W = qkv_width; NH % NKV == 0.
struct AttentionDims { int64_t B, T, NH, NKV, HD, W; };
/// qkv [B,T,W] against `shape` (no outputs checked).
AttentionDims qkv(const Tensor& qkv, const AttentionShape& shape, const char* op);
AttentionDims attention(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                        const AttentionShape& shape);
AttentionDims attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& out, const Tensor& lse,
                                 const AttentionShape& shape);

/// cu_seqlens int32 [D+1], D >= 1 (the documents of attention_varlen_forward; the values
/// are on the device and not read here).
void documents(const Tensor& cu_seqlens, const char* op);
/// attention's arguments and the documents.
AttentionDims attention_varlen(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                               const Tensor& cu_seqlens, const AttentionShape& shape);
/// attention_backward's arguments and the documents.
AttentionDims attention_varlen_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                        const Tensor& out, const Tensor& lse,
                                        const Tensor& cu_seqlens, const AttentionShape& shape);

/// An attention tile's buffers (see Backend::attention_tile_forward): dims of qkv, Tk the
/// rows of kv [B,Tk,2*NKV*HD]; the tile inside both; with documents (cu_seqlens not
/// empty) its positions inside the sequences of tile.seq_len.
struct TileDims { AttentionDims a; int64_t Tk; };
TileDims attention_tile(const Tensor& out_acc, const Tensor& lse, const Tensor& qkv,
                        const Tensor& kv, const Tensor& cu_seqlens, const AttentionShape& shape,
                        const AttentionTile& tile);
/// The backward's: dq like out_acc, dkv like kv but fp32, dout and out [B,T,NH*HD] in qkv's dtype.
TileDims attention_tile_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                                 const Tensor& qkv, const Tensor& kv, const Tensor& out,
                                 const Tensor& lse, const Tensor& cu_seqlens,
                                 const AttentionShape& shape, const AttentionTile& tile);
/// copy_columns: rows N and the widths; throws when a range leaves its tensor.
struct ColumnDims { int64_t N, Wd, Ws; };
ColumnDims copy_columns(const Tensor& dst, const Tensor& src, int64_t dst_col, int64_t src_col,
                        int64_t ncols);
/// add_columns: rows N, out's width Wd and src's Ws; out and src of one dtype, not
/// overlapping; throws when [out_col, out_col + Ws) leaves out.
ColumnDims add_columns(const Tensor& out, const Tensor& src, int64_t out_col);

struct DecodeDims { int64_t B, T, NH, NKV, HD, W, Tmax; };
DecodeDims attention_decode(const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                            const Tensor& qkv, int64_t past, const AttentionShape& shape);

/// qkv [B,T,W], positions empty or [B,T], HD even.
AttentionDims rope(const Tensor& qkv, const Tensor& positions, const AttentionShape& shape);

struct CrossEntropyDims { int64_t N, Vp; };
CrossEntropyDims cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                               const Tensor& targets, int vocab_size);

/// The vocab-parallel cross-entropy ops: logits [N,Vl], targets int32 [N], 0 <= valid <= Vl,
/// vocab_begin >= 0; `stats` fp32 [N,3] (part 1) or dlogits like logits and lse fp32 [N]
/// (part 2; pass an empty stats). Vp of the result is Vl.
CrossEntropyDims cross_entropy_shard(const Tensor& stats, const Tensor& dlogits,
                                     const Tensor& logits, const Tensor& targets,
                                     const Tensor& lse, int64_t vocab_begin, int valid);
/// shard_ids: int32 out and ids of one size, 0 <= begin, 0 <= count.
void shard_ids(const Tensor& out, const Tensor& ids, int64_t begin, int64_t count);

/// patchify: images fp32 [B,H,W,Ci], H and W multiples of `patch`, out float
/// [B, T, Ci*patch^2] with T >= (H/patch)(W/patch). Returns the number of patches N.
int64_t patchify(const Tensor& out, const Tensor& images, int patch);
/// unpatchify: the same shapes as patchify, images written from `patches`.
int64_t unpatchify(const Tensor& images, const Tensor& patches, int patch);

/// modulate: x and out [B,T,C], mod [B,M,C], all of x's float dtype; 0 <= scale_index < M,
/// shift_index -1 or in [0, M) and != scale_index.
struct ModulateDims { int64_t B, T, C, M; };
ModulateDims modulate(const Tensor& out, const Tensor& x, const Tensor& mod, int scale_index,
                      int shift_index);
/// modulate_backward: dout like x, dx empty or like x, dmod like mod.
ModulateDims modulate_backward(const Tensor& dx, const Tensor& dmod, const Tensor& dout,
                               const Tensor& x, const Tensor& mod, int scale_index,
                               int shift_index);

/// Per-sample ops over [B, ...] tensors: B = size(0), n = numel / B elements per sample.
struct SampleDims { int64_t B, n; };
/// rectified_flow_inputs: xt, target, images, noise fp32 of one shape (rank >= 1), t fp32
/// [B]; xt and target distinct.
SampleDims rectified_flow_inputs(const Tensor& xt, const Tensor& target, const Tensor& images,
                                 const Tensor& noise, const Tensor& t);
/// mse_loss: pred float [B, ...] with n >= 1 elements per sample (when B > 0), target fp32
/// of pred's shape, losses fp32 [B], dpred empty or pred's shape and dtype.
SampleDims mse_loss(const Tensor& losses, const Tensor& dpred, const Tensor& pred,
                    const Tensor& target);

/// A parameter gradient: as many elements as the parameter, in fp32 or its dtype.
void grad_of(const Tensor& grad, const Tensor& param, const char* op);

/// Same number of elements and dtype.
void same_size(const Tensor& a, const Tensor& b, const char* op);

/// accumulate_loss: acc fp64 [2], losses fp32 [N], targets int32 [N]. Returns N.
int64_t accumulate_loss(const Tensor& acc, const Tensor& losses, const Tensor& targets);
/// cross_entropy_shard_combine: stats fp32 [tp*N, 3], lse fp32 [N], targets int32 [N],
/// acc fp64 [2]. Returns {N, tp} as {N, Vp}.
CrossEntropyDims cross_entropy_shard_combine(const Tensor& lse, const Tensor& acc,
                                             const Tensor& stats, const Tensor& targets);
/// sum_squares: acc fp64 [1], x any float dtype.
void sum_squares(const Tensor& acc, const Tensor& x);
/// clip_coefficient: coef fp32 [1], sumsq fp64 [1], check fp64 [1] or empty, loss_scale > 0.
void clip_coefficient(const Tensor& coef, const Tensor& sumsq, const Tensor& check,
                      float loss_scale);
/// adamw_step's scale: empty, or fp32 [1].
void adamw_scale(const Tensor& scale);
/// adamw_multi_step: every tensor's grad, m, v (and master) with param's element count;
/// m, v and master fp32; scale as adamw_scale.
void adamw_multi(std::span<const AdamWTensor> tensors, const Tensor& scale);
/// ema_update: ema fp32, param a float dtype with ema's element count, 0 <= decay <= 1.
void ema_update(const Tensor& ema, const Tensor& param, float decay);

/// The MoE router: logits fp32 [N,E], 1 <= spec.k <= E, scores fp32 [N,E], expert_idx
/// int32 [N,k], expert_weight fp32 [N,k], bias empty or fp32 [E].
struct MoeRouterDims { int64_t N, E, k; };
MoeRouterDims moe_router(const Tensor& scores, const Tensor& expert_idx,
                         const Tensor& expert_weight, const Tensor& logits, const Tensor& bias,
                         const MoeRouterSpec& spec);
/// Its backward: scores as forward's, dlogits like scores, dexpert_weight fp32 [N,k],
/// dscores empty or like scores, expert_idx int32 [N,k].
MoeRouterDims moe_router_backward(const Tensor& dlogits, const Tensor& dexpert_weight,
                                  const Tensor& dscores, const Tensor& scores,
                                  const Tensor& expert_idx, const MoeRouterSpec& spec);
/// moe_balance_stats: logits fp32 [N,E], expert_idx int32 [N,k] (k <= E), load and prob
/// empty or fp32 [E], z empty or fp32 [1]. Returns {N, E, k}.
MoeRouterDims moe_balance_stats(const Tensor& load, const Tensor& prob, const Tensor& z,
                                const Tensor& logits, const Tensor& expert_idx);
/// moe_balance_backward: dlogits and logits fp32 [N,E], load empty or fp32 [E]. k = 0.
MoeRouterDims moe_balance_backward(const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& load);
/// moe_permute_plan: expert_idx int32 [N,k], rows int32 [N,k], offsets int32 [E+1], E >= 1,
/// capacity >= 0. Returns {N, E, k}.
MoeRouterDims moe_permute_plan(const Tensor& offsets, const Tensor& rows,
                               const Tensor& expert_idx, int64_t capacity);
/// The permutation ops: rows int32 [N,k], tokens [N,C] and expert_rows [N*k, C] of one float
/// dtype; `op` names the caller in the messages.
struct MoePermuteDims { int64_t N, k, C; };
MoePermuteDims moe_permute(const Tensor& tokens, const Tensor& expert_rows, const Tensor& rows,
                           const char* op);
/// moe_unpermute: out as tokens, expert_out as expert_rows, expert_weight fp32 [N,k].
MoePermuteDims moe_unpermute(const Tensor& out, const Tensor& expert_out,
                             const Tensor& expert_weight, const Tensor& rows);
/// moe_unpermute_backward: dout, expert_out, expert_weight as moe_unpermute's; dexpert_out
/// empty or like expert_out; dexpert_weight empty or fp32 [N,k].
MoePermuteDims moe_unpermute_backward(const Tensor& dexpert_out, const Tensor& dexpert_weight,
                                      const Tensor& dout, const Tensor& expert_out,
                                      const Tensor& expert_weight, const Tensor& rows);
/// grouped_linear: weight [E,O,I], inp [M,I], out [M,O], all of one float dtype, offsets
/// int32 [E+1] (its values are not read here: they may be on a device).
struct GroupedLinearDims { int64_t M, I, O, E; };
GroupedLinearDims grouped_linear(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                 const Tensor& offsets);
/// A grouped linear's offsets [E+1], read on the host (the CPU's tensor, or the CUDA
/// backend's copy): throws unless they rise from 0 to at most M (M_kept < M: slots dropped
/// past an expert's capacity). `op` names the caller in the message.
void grouped_linear_offsets(const int32_t* offsets, int64_t M, int64_t E, const char* op);
/// grouped_linear_backward: dout as out; dinp empty or like inp; dweight empty or a
/// gradient of weight (fp32 or its dtype).
GroupedLinearDims grouped_linear_backward(const Tensor& dinp, const Tensor& dweight,
                                          const Tensor& dout, const Tensor& inp,
                                          const Tensor& weight, const Tensor& offsets);

}  // namespace kiln::checks

#include "backend/meta/meta_calls.h"

#include "backend/op_checks.h"
#include "core/error.h"

namespace kiln::meta_calls {

namespace {
MetaCallInfo info(Op call, DType dtype) {
  MetaCallInfo c;
  c.call = call;
  c.dtype = dtype;
  return c;
}
MetaCallInfo embedding(Op call, const checks::EmbeddingDims& d, DType dt) {
  MetaCallInfo c = info(call, dt);
  c.B = d.B, c.T = d.T, c.C = d.C, c.Vp = d.Vp, c.N = d.B * d.T;
  return c;
}
MetaCallInfo rows(Op call, const checks::RowDims& d, DType dt) {
  MetaCallInfo c = info(call, dt);
  c.N = d.N, c.C = d.C;
  return c;
}
MetaCallInfo attention(Op call, const checks::AttentionDims& d, DType dt) {
  MetaCallInfo c = info(call, dt);
  c.B = d.B, c.T = d.T, c.NH = d.NH, c.NKV = d.NKV, c.HD = d.HD, c.C = d.NH * d.HD;
  c.N = d.B * d.T;
  return c;
}
MetaCallInfo elements(Op call, const Tensor& t) {
  MetaCallInfo c = info(call, t.dtype());
  c.numel = t.numel();
  return c;
}
}  // namespace

MetaCallInfo embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& positions,
                               const Tensor& wte, const Tensor& wpe) {
  return embedding(Op::EmbeddingForward,
                   checks::embedding(out, tokens, positions, wte, wpe), out.dtype());
}
MetaCallInfo embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                const Tensor& tokens, const Tensor& positions) {
  return embedding(Op::EmbeddingBackward,
                   checks::embedding(dout, tokens, positions, dwte, dwpe), dout.dtype());
}

MetaCallInfo layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                               const Tensor& inp, const Tensor& weight, const Tensor& bias,
                               float) {
  return rows(Op::LayerNormForward, checks::layernorm(out, mean, rstd, inp, weight, bias),
              inp.dtype());
}
MetaCallInfo layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                const Tensor& mean, const Tensor& rstd) {
  return rows(Op::LayerNormBackward,
              checks::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd),
              inp.dtype());
}
MetaCallInfo rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp,
                             const Tensor& weight, float) {
  return rows(Op::RMSNormForward, checks::rmsnorm(out, rstd, inp, weight), inp.dtype());
}
MetaCallInfo rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                              const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  return rows(Op::RMSNormBackward,
              checks::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd), inp.dtype());
}

MetaCallInfo linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                            const Tensor& bias) {
  const auto d = checks::linear(out, inp, weight, bias);
  MetaCallInfo c = info(Op::LinearForward, inp.dtype());
  c.N = d.N, c.IC = d.IC, c.OC = d.OC;
  c.has_bias = static_cast<bool>(bias);
  return c;
}
MetaCallInfo linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                             const Tensor& dout, const Tensor& inp, const Tensor& weight) {
  const auto d = checks::linear_backward(dinp, dweight, dbias, dout, inp, weight);
  MetaCallInfo c = info(Op::LinearBackward, inp.dtype());
  c.N = d.N, c.IC = d.IC, c.OC = d.OC;
  c.has_bias = static_cast<bool>(dbias);
  c.has_dinp = static_cast<bool>(dinp);
  c.has_dweight = static_cast<bool>(dweight);
  if (dweight) c.grad_dtype = dweight.dtype();
  return c;
}

MetaCallInfo fp8_amax(const Tensor& amax, const Tensor& x) {
  checks::fp8_amax(amax, x);
  return elements(Op::Fp8Amax, x);
}
MetaCallInfo fp8_amax_history(const Tensor& amax, const Tensor& history,
                              const Tensor& step_amax, int64_t slot, bool) {
  checks::fp8_amax_history(amax, history, step_amax, slot);
  return elements(Op::Fp8AmaxHistory, history);
}
MetaCallInfo fp8_linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                const Tensor& bias, const Tensor& amax) {
  checks::fp8_linear(out, inp, weight, bias, amax);
  MetaCallInfo c = linear_forward(out, inp, weight, bias);
  c.call = Op::Fp8LinearForward;
  return c;
}
MetaCallInfo fp8_linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                 const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                 const Tensor& amax) {
  checks::fp8_linear_backward(dinp, dweight, dbias, dout, inp, weight, amax);
  MetaCallInfo c = linear_backward(dinp, dweight, dbias, dout, inp, weight);
  c.call = Op::Fp8LinearBackward;
  return c;
}

MetaCallInfo attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                               const AttentionShape& shape, const DropoutSpec&) {
  return attention(Op::AttentionForward, checks::attention(out, lse, qkv, shape),
                   qkv.dtype());
}
MetaCallInfo attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                const Tensor& out, const Tensor& lse,
                                const AttentionShape& shape, const DropoutSpec&) {
  return attention(Op::AttentionBackward,
                   checks::attention_backward(dqkv, dout, qkv, out, lse, shape), qkv.dtype());
}
MetaCallInfo attention_varlen_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                      const Tensor& cu_seqlens, const AttentionShape& shape,
                                      const DropoutSpec&) {
  return attention(Op::AttentionVarlenForward,
                   checks::attention_varlen(out, lse, qkv, cu_seqlens, shape), qkv.dtype());
}
MetaCallInfo attention_varlen_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                       const Tensor& out, const Tensor& lse,
                                       const Tensor& cu_seqlens, const AttentionShape& shape,
                                       const DropoutSpec&) {
  return attention(Op::AttentionVarlenBackward,
                   checks::attention_varlen_backward(dqkv, dout, qkv, out, lse, cu_seqlens, shape),
                   qkv.dtype());
}
MetaCallInfo attention_decode(const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                              const Tensor& qkv, int64_t past, const AttentionShape& shape) {
  const auto d = checks::attention_decode(out, k_cache, v_cache, qkv, past, shape);
  MetaCallInfo c = info(Op::AttentionDecode, qkv.dtype());
  c.B = d.B, c.T = d.T, c.NH = d.NH, c.NKV = d.NKV, c.HD = d.HD, c.C = d.NH * d.HD;
  return c;
}
MetaCallInfo attention_tile_forward(const Tensor& out_acc, const Tensor& lse, const Tensor& qkv,
                                    const Tensor& kv, const Tensor& cu_seqlens,
                                    const AttentionShape& shape, const AttentionTile& tile) {
  return attention(Op::AttentionTileForward,
                   checks::attention_tile(out_acc, lse, qkv, kv, cu_seqlens, shape, tile).a,
                   qkv.dtype());
}
MetaCallInfo attention_tile_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                                     const Tensor& qkv, const Tensor& kv, const Tensor& out,
                                     const Tensor& lse, const Tensor& cu_seqlens,
                                     const AttentionShape& shape, const AttentionTile& tile) {
  return attention(Op::AttentionTileBackward,
                   checks::attention_tile_backward(dq, dkv, dout, qkv, kv, out, lse, cu_seqlens,
                                                   shape, tile).a,
                   qkv.dtype());
}
MetaCallInfo copy_columns(const Tensor& dst, const Tensor& src, int64_t dst_col, int64_t src_col,
                          int64_t ncols) {
  const auto d = checks::copy_columns(dst, src, dst_col, src_col, ncols);
  MetaCallInfo c = info(Op::CopyColumns, dst.dtype());
  c.N = d.N, c.numel = d.N * ncols;
  return c;
}
MetaCallInfo rope_forward(const Tensor& qkv, const Tensor& positions,
                          const AttentionShape& shape, const RopeSpec&) {
  return attention(Op::RopeForward, checks::rope(qkv, positions, shape), qkv.dtype());
}
MetaCallInfo rope_backward(const Tensor& dqkv, const Tensor& positions,
                           const AttentionShape& shape, const RopeSpec&) {
  return attention(Op::RopeBackward, checks::rope(dqkv, positions, shape), dqkv.dtype());
}

MetaCallInfo gelu_forward(const Tensor& out, const Tensor& inp) {
  checks::same_size(out, inp, "gelu");
  return elements(Op::GeluForward, inp);
}
MetaCallInfo gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  checks::same_size(dinp, inp, "gelu_backward");
  checks::same_size(dout, inp, "gelu_backward");
  return elements(Op::GeluBackward, inp);
}
MetaCallInfo silu_forward(const Tensor& out, const Tensor& inp) {
  checks::same_size(out, inp, "silu");
  return elements(Op::SiluForward, inp);
}
MetaCallInfo silu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  checks::same_size(dinp, inp, "silu_backward");
  checks::same_size(dout, inp, "silu_backward");
  return elements(Op::SiluBackward, inp);
}
MetaCallInfo swiglu_forward(const Tensor& out, const Tensor& inp) {
  const auto d = checks::swiglu(out, inp);
  MetaCallInfo c = elements(Op::SwiGluForward, inp);
  c.N = d.N, c.H = d.H;
  return c;
}
MetaCallInfo swiglu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  const auto d = checks::swiglu(dout, inp);
  checks::same_size(dinp, inp, "swiglu_backward dinp");
  MetaCallInfo c = elements(Op::SwiGluBackward, inp);
  c.N = d.N, c.H = d.H;
  return c;
}
MetaCallInfo add(const Tensor& out, const Tensor& a, const Tensor& b) {
  checks::same_size(out, a, "add");
  checks::same_size(out, b, "add");
  return elements(Op::Add, out);
}
MetaCallInfo add_columns(const Tensor& out, const Tensor& src, int64_t out_col, float) {
  const auto d = checks::add_columns(out, src, out_col);
  MetaCallInfo c = info(Op::AddColumns, out.dtype());
  c.N = d.N, c.numel = d.N * d.Ws;
  return c;
}
MetaCallInfo modulate(const Tensor& out, const Tensor& x, const Tensor& mod, int scale_index,
                      int shift_index, float) {
  const auto d = checks::modulate(out, x, mod, scale_index, shift_index);
  MetaCallInfo c = elements(Op::Modulate, x);
  c.B = d.B, c.T = d.T, c.C = d.C, c.N = d.B * d.T;
  return c;
}
MetaCallInfo modulate_backward(const Tensor& dx, const Tensor& dmod, const Tensor& dout,
                               const Tensor& x, const Tensor& mod, int scale_index,
                               int shift_index, float) {
  const auto d = checks::modulate_backward(dx, dmod, dout, x, mod, scale_index, shift_index);
  MetaCallInfo c = elements(Op::ModulateBackward, x);
  c.B = d.B, c.T = d.T, c.C = d.C, c.N = d.B * d.T;
  c.has_dinp = static_cast<bool>(dx);
  return c;
}
MetaCallInfo dropout_forward(const Tensor& out, const Tensor& inp, const DropoutSpec&) {
  checks::same_size(out, inp, "dropout");
  return elements(Op::DropoutForward, inp);
}
MetaCallInfo dropout_backward(const Tensor& dinp, const Tensor& dout, const DropoutSpec&) {
  checks::same_size(dinp, dout, "dropout_backward");
  return elements(Op::DropoutBackward, dout);
}

MetaCallInfo softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits,
                                   const Tensor& logits, const Tensor& targets, int vocab_size,
                                   int, float) {
  const auto d = checks::cross_entropy(losses, dlogits, logits, targets, vocab_size);
  MetaCallInfo c = info(Op::SoftmaxCrossEntropy, logits.dtype());
  c.N = d.N, c.Vp = d.Vp;
  return c;
}

MetaCallInfo cross_entropy_shard_stats(const Tensor& stats, const Tensor& logits,
                                       const Tensor& targets, int64_t vocab_begin, int valid) {
  const auto d = checks::cross_entropy_shard(stats, Tensor(), logits, targets, Tensor(),
                                             vocab_begin, valid);
  MetaCallInfo c = info(Op::CrossEntropyShardStats, logits.dtype());
  c.N = d.N, c.Vp = d.Vp;
  return c;
}

MetaCallInfo cross_entropy_shard_backward(const Tensor& dlogits, const Tensor& logits,
                                          const Tensor& targets, const Tensor& lse,
                                          int64_t vocab_begin, int valid, int, float) {
  const auto d = checks::cross_entropy_shard(Tensor(), dlogits, logits, targets, lse, vocab_begin,
                                             valid);
  MetaCallInfo c = info(Op::CrossEntropyShardBackward, logits.dtype());
  c.N = d.N, c.Vp = d.Vp;
  return c;
}

MetaCallInfo shard_ids(const Tensor& out, const Tensor& ids, int64_t begin, int64_t count) {
  checks::shard_ids(out, ids, begin, count);
  MetaCallInfo c = info(Op::ShardIds, DType::I32);
  c.numel = ids.numel();
  return c;
}

MetaCallInfo patchify(const Tensor& out, const Tensor& images, int patch) {
  checks::patchify(out, images, patch);
  return elements(Op::Patchify, out);
}

MetaCallInfo unpatchify(const Tensor& images, const Tensor& patches, int patch) {
  checks::unpatchify(images, patches, patch);
  MetaCallInfo c = info(Op::Unpatchify, patches.dtype());
  c.numel = images.numel();
  return c;
}

MetaCallInfo rectified_flow_inputs(const Tensor& xt, const Tensor& target, const Tensor& images,
                                   const Tensor& noise, const Tensor& t) {
  const auto d = checks::rectified_flow_inputs(xt, target, images, noise, t);
  MetaCallInfo c = elements(Op::RectifiedFlowInputs, images);
  c.B = d.B;
  return c;
}
MetaCallInfo mse_loss(const Tensor& losses, const Tensor& dpred, const Tensor& pred,
                      const Tensor& target, float) {
  const auto d = checks::mse_loss(losses, dpred, pred, target);
  MetaCallInfo c = elements(Op::MseLoss, pred);
  c.B = d.B;
  return c;
}

MetaCallInfo accumulate_loss(const Tensor& acc, const Tensor& losses, const Tensor& targets) {
  MetaCallInfo c = info(Op::AccumulateLoss, DType::F32);
  c.N = checks::accumulate_loss(acc, losses, targets);
  return c;
}
MetaCallInfo cross_entropy_shard_combine(const Tensor& lse, const Tensor& acc,
                                         const Tensor& stats, const Tensor& targets) {
  MetaCallInfo c = info(Op::CrossEntropyShardCombine, DType::F32);
  c.N = checks::cross_entropy_shard_combine(lse, acc, stats, targets).N;
  return c;
}
MetaCallInfo sum_squares(const Tensor& acc, const Tensor& x) {
  checks::sum_squares(acc, x);
  return elements(Op::SumSquares, x);
}
MetaCallInfo clip_coefficient(const Tensor& coef, const Tensor& sumsq, const Tensor& check,
                              double, float loss_scale) {
  checks::clip_coefficient(coef, sumsq, check, loss_scale);
  return info(Op::ClipCoefficient, DType::F32);
}

MetaCallInfo adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m,
                        const Tensor& v, const Tensor& scale, const AdamWParams&) {
  checks::adamw_scale(scale);
  // Element counts only: with mixed precision the dtypes of param, grad and m/v differ.
  KILN_CHECK(grad.numel() == param.numel() && m.numel() == param.numel() &&
                 v.numel() == param.numel(),
             "adamw: grad {}, m {} and v {} must match param {}", grad.str(), m.str(), v.str(),
             param.str());
  return elements(Op::AdamW, param);
}

MetaCallInfo adamw_multi_step(std::span<const AdamWTensor> tensors, const Tensor& scale,
                              const AdamWParams&) {
  checks::adamw_multi(tensors, scale);
  MetaCallInfo c = info(Op::AdamWMulti, DType::F32);
  for (const AdamWTensor& t : tensors) c.numel += t.param.numel();
  return c;
}

MetaCallInfo ema_update(const Tensor& ema, const Tensor& param, float decay) {
  checks::ema_update(ema, param, decay);
  return elements(Op::Ema, ema);
}

MetaCallInfo moe_router_forward(const Tensor& scores, const Tensor& expert_idx,
                                const Tensor& expert_weight, const Tensor& logits,
                                const Tensor& bias, const MoeRouterSpec& spec) {
  const auto d = checks::moe_router(scores, expert_idx, expert_weight, logits, bias, spec);
  MetaCallInfo c = info(Op::MoeRouterForward, DType::F32);
  c.N = d.N, c.C = d.E;
  return c;
}
MetaCallInfo moe_router_backward(const Tensor& dlogits, const Tensor& dexpert_weight,
                                 const Tensor& dscores, const Tensor& scores,
                                 const Tensor& expert_idx, const MoeRouterSpec& spec) {
  const auto d =
      checks::moe_router_backward(dlogits, dexpert_weight, dscores, scores, expert_idx, spec);
  MetaCallInfo c = info(Op::MoeRouterBackward, DType::F32);
  c.N = d.N, c.C = d.E;
  return c;
}
MetaCallInfo moe_balance_stats(const Tensor& load, const Tensor& prob, const Tensor& z,
                               const Tensor& logits, const Tensor& expert_idx, MoeScoring, float,
                               float) {
  const auto d = checks::moe_balance_stats(load, prob, z, logits, expert_idx);
  MetaCallInfo c = info(Op::MoeBalanceStats, DType::F32);
  c.N = d.N, c.C = d.E;
  return c;
}
MetaCallInfo moe_balance_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& load,
                                  MoeScoring, float, float) {
  const auto d = checks::moe_balance_backward(dlogits, logits, load);
  MetaCallInfo c = info(Op::MoeBalanceBackward, DType::F32);
  c.N = d.N, c.C = d.E;
  return c;
}
MetaCallInfo moe_permute_plan(const Tensor& offsets, const Tensor& rows,
                              const Tensor& expert_idx, int64_t capacity) {
  const auto d = checks::moe_permute_plan(offsets, rows, expert_idx, capacity);
  MetaCallInfo c = info(Op::MoePermutePlan, DType::I32);
  c.N = d.N, c.numel = d.N * d.k, c.E = d.E;
  return c;
}
namespace {
MetaCallInfo permutation(Op call, const checks::MoePermuteDims& d, DType dt) {
  MetaCallInfo c = info(call, dt);
  c.N = d.N, c.C = d.C, c.numel = d.N * d.k * d.C;
  return c;
}
}  // namespace
MetaCallInfo moe_permute(const Tensor& out, const Tensor& inp, const Tensor& rows) {
  return permutation(Op::MoePermute, checks::moe_permute(inp, out, rows, "moe_permute"),
                     inp.dtype());
}
MetaCallInfo moe_permute_backward(const Tensor& dinp, const Tensor& dout, const Tensor& rows) {
  return permutation(Op::MoePermuteBackward,
                     checks::moe_permute(dinp, dout, rows, "moe_permute_backward"), dout.dtype());
}
MetaCallInfo moe_unpermute(const Tensor& out, const Tensor& expert_out,
                           const Tensor& expert_weight, const Tensor& rows) {
  return permutation(Op::MoeUnpermute, checks::moe_unpermute(out, expert_out, expert_weight, rows),
                     out.dtype());
}
MetaCallInfo moe_unpermute_backward(const Tensor& dexpert_out, const Tensor& dexpert_weight,
                                    const Tensor& dout, const Tensor& expert_out,
                                    const Tensor& expert_weight, const Tensor& rows) {
  return permutation(Op::MoeUnpermuteBackward,
                     checks::moe_unpermute_backward(dexpert_out, dexpert_weight, dout, expert_out,
                                                    expert_weight, rows),
                     dout.dtype());
}
// A grouped linear's sizes as one linear's of all M rows (N = M); the scratch model knows
// how the backend splits them (src/plan/scratch_models.cpp).
MetaCallInfo grouped_linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                    const Tensor& offsets) {
  const auto d = checks::grouped_linear(out, inp, weight, offsets);
  MetaCallInfo c = info(Op::GroupedLinearForward, inp.dtype());
  c.N = d.M, c.IC = d.I, c.OC = d.O, c.E = d.E;
  return c;
}
MetaCallInfo grouped_linear_backward(const Tensor& dinp, const Tensor& dweight,
                                     const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                     const Tensor& offsets) {
  const auto d = checks::grouped_linear_backward(dinp, dweight, dout, inp, weight, offsets);
  MetaCallInfo c = info(Op::GroupedLinearBackward, inp.dtype());
  c.N = d.M, c.IC = d.I, c.OC = d.O, c.E = d.E;
  c.has_dinp = static_cast<bool>(dinp);
  c.has_dweight = static_cast<bool>(dweight);
  if (dweight) c.grad_dtype = dweight.dtype();
  return c;
}

}  // namespace kiln::meta_calls

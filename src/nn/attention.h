// Self-attention (Vaswani et al. 2017) as a layer: a fused q/k/v projection, the
// attention op of the backend, and the output projection.
//
// q, k and v are column ranges of ONE buffer qkv [B, T, (NH + 2 NKV) * HD]: q in columns
// [0, NH*HD), k in [NH*HD, (NH+NKV)*HD), v after, each head's HD columns contiguous (the
// layout of GPT-2's c_attn output), so a fused projection needs no copy.
// QK-norm (Qwen3; Dehghani et al. 2023): with AttentionSpec::qk_norm each q head and each
// k head is RMS-normalised over its HD channels after the projection and before rotary,
// with one gain [HD] for all q heads (<q_norm>.weight) and one for all k heads
// (<k_norm>.weight). The heads are column ranges of qkv, so each kind is copied out to a
// contiguous [B*T*heads, HD] buffer (the norm's saved input), normalised, and copied back.
// Saved (all recomputed with the block): qkv (normalised and rotated as attention reads
// it), the attention output [B,T,NH*HD] (the output projection's input) and the row
// log-sum-exp fp32 [B,NH,T]; never the [T,T] probabilities (FlashAttention: Dao et al.
// 2022); with QK-norm also the un-normalised q [B,T,NH*HD] and k [B,T,NKV*HD] and their
// rstd fp32 [B*T*NH], [B*T*NKV].
//
// Tensor parallel (shard()): the layer takes the placements of its two Linears from the
// model's plan table (models/layer_plan.h, applied by parallel/tp_plan.h) and chooses none
// itself. Column then row (the decoders' plan, Megatron-LM): each tp rank computes NH/tp
// query heads over NKV/tp key/value heads, the fused projection split in its q, k and v
// pieces separately (a layout fact of this layer) and the output projection's input
// features split; saved tensors are the rank's heads. The QK-norm gains act per head, so a
// rank applies them to its heads unchanged; their gradients are then partial sums over the
// tp group's heads (Param::tp_partial_grad). Both replicated: the whole layer on every rank.
// Context parallel (set_context_parallel(), installed by parallel/context_parallel.h where
// the model's context-parallel table puts attention on the ring): the rank's rows of every
// sequence attend to the whole sequence by ring attention (nn/context_parallel.h); saved
// tensors stay the rank's rows, so they shrink as 1/cp.
#pragma once

#include "backend/backend.h"
#include "nn/context_parallel.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "nn/saved.h"

#include <vector>

namespace kiln::nn {

/// An attention layer's shape (AttentionShape: NH query heads over NKV key/value heads,
/// head size HD, causal or bidirectional; NH * HD need not be the model width C), its
/// position encoding: rotary (Su et al. 2021, applied to q and k after the projection, at
/// the batch's positions) or none, and optional QK-norm (per-head RMSNorm of q and k
/// before rotary, epsilon qk_norm_eps: Qwen3).
struct AttentionSpec : AttentionShape {
  bool rotary = false;
  RopeSpec rope;
  bool qk_norm = false;
  float qk_norm_eps = 1e-6f;
  /// Throws kiln::Error naming an impossible shape (NH not a multiple of NKV, odd HD
  /// with rotary, ...).
  void check() const;
};

/// Where the tensor-parallel plan puts the layer's two Linears: qkv Column and proj Row
/// (heads split), or both Replicated.
struct AttentionPlacement {
  TpPlacement qkv, proj;
};

class SelfAttention {
 public:
  /// Parameters <qkv_name>.{weight,bias} [qkv_width, C] and <out_name>.{weight,bias}
  /// [C, NH*HD]; out_init_std for the output projection (GPT-2 scales residual
  /// projections by 1/sqrt(2 n_layer)). With spec.qk_norm also the gains
  /// <q_norm_name>.weight and <k_norm_name>.weight [HD] (ones, no weight decay); throws
  /// kiln::Error when a name is then empty.
  SelfAttention(const std::string& qkv_name, const std::string& out_name, int64_t C,
                const AttentionSpec& spec, bool bias, float init_std, float out_init_std,
                const std::string& q_norm_name = {}, const std::string& k_norm_name = {});

  /// Installs the plan's placements. qkv Column and proj Row split the heads over their
  /// group (sequence parallel as the placements say); both Replicated leave the layer
  /// whole. Throws kiln::Error naming the layer for another pair of styles, or unless NH
  /// and NKV divide by the group's size.
  void shard(const AttentionPlacement& placement);
  /// Attends over the sequences split across `group` (ring attention). Forward then
  /// refuses attention dropout with a kiln::Error.
  void set_context_parallel(CpGroup& group) { cp_ = group.size() > 1 ? &group : nullptr; }
  /// What forward saves, in the order of the indices below: kQkv, kAttn, kLse, then with
  /// QK-norm kQIn, kKIn, kQRstd, kKRstd (num_saved() in all).
  std::vector<SavedSpec> saved_specs(int64_t B, int64_t T, DType dtype) const;
  enum : size_t { kQkv, kAttn, kLse, kQIn, kKIn, kQRstd, kKRstd };
  size_t num_saved() const { return spec_.qk_norm ? 7 : 3; }
  /// The width of backward's dattn scratch: NH*HD (the rank's heads), twice that with
  /// QK-norm (the norms' output and input gradients side by side).
  int64_t dattn_width() const { return local_.q_width() * (spec_.qk_norm ? 2 : 1); }
  /// out [B,T,C] = proj(attention(rope(qkv(inp)))), inp [B,T,C]; positions int32 [B,T]
  /// or empty (0..T-1) for the rotary angles; cu_seqlens int32 [D+1] the documents packed
  /// into the sequences (Backend::attention_varlen_forward; under context parallelism those
  /// of the whole sequences) or empty: a query sees only its document's keys; dropout on
  /// the probabilities. Sharded: inp and out are the rank's rows under sequence
  /// parallelism, `work` [B*T, C] scratch (Linear).
  void forward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& out,
               const Tensor& inp, const Tensor& positions, const Tensor& cu_seqlens,
               const DropoutSpec& dropout, const Tensor& work = Tensor()) const;
  /// dinp [B,T,C] (overwritten) from dout [B,T,C]; parameter gradients accumulate.
  /// Scratch: dattn [B,T,dattn_width()], dqkv [B,T,qkv_width] (the rank's heads when
  /// sharded).
  void backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dinp,
                const Tensor& dout, const Tensor& inp, const Tensor& dattn, const Tensor& dqkv,
                const Tensor& positions, const Tensor& cu_seqlens, const DropoutSpec& dropout,
                const Tensor& work = Tensor()) const;
  /// Inference over a KV cache (see Backend::attention_decode): inp [B,Tq,C] at
  /// positions past.. (`positions` int32 [B,Tq] holds them when rotary; may be empty
  /// otherwise), out [B,Tq,C]; scratch qkv [B,Tq,qkv_width], attn [B,Tq,NH*HD]. The
  /// cache holds k as attention reads it (normalised and rotated).
  void decode(Backend& be, Stream s, const Tensor& out, const Tensor& inp, const Tensor& qkv,
              const Tensor& attn, const Tensor& k_cache, const Tensor& v_cache, int64_t past,
              const Tensor& positions) const;
  void collect(std::vector<Param*>& out);

  const AttentionSpec& spec() const { return spec_; }
  /// The heads this rank computes (spec() unless sharded).
  const AttentionSpec& local_spec() const { return local_; }
  Linear qkv, proj;
  Norm q_norm, k_norm;  // QK-norm's gains (no parameters without spec().qk_norm)

 private:
  /// The probabilities' dropout at global heads (this rank's first head among NH).
  DropoutSpec at_heads(const DropoutSpec& d) const;
  /// QK-norm in place on the q and k heads of qkv_buf [B,T,qkv_width] of `shape`: each
  /// kind copied to q_in [B,T,NH*HD] / k_in [B,T,NKV*HD], normalised into tmp (at least
  /// [B,T,NH*HD]) with its rstd (fp32, a row per head), copied back.
  void norm_qk(Backend& be, Stream s, const Tensor& qkv_buf, std::span<const Tensor> norm_saved,
               const Tensor& tmp, const AttentionShape& shape) const;
  /// QK-norm's backward in place on dqkv [B,T,qkv_width] (the gradient of the normalised
  /// q and k on entry, of the projection's q and k on return); gains' gradients +=.
  /// scratch: [B,T,2*NH*HD] at least.
  void norm_qk_backward(Backend& be, Stream s, const Tensor& dqkv,
                        std::span<const Tensor> norm_saved, const Tensor& scratch) const;
  AttentionSpec spec_, local_;
  int first_head_ = 0;  // this rank's first query head
  CpGroup* cp_ = nullptr;  // a context-parallel group of more than one rank
};

}  // namespace kiln::nn

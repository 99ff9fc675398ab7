// Joint attention of two token streams (MMDiT: Esser et al. 2024, "Scaling Rectified
// Flow Transformers for High-Resolution Image Synthesis", 2.3 and Figure 2; Stable
// Diffusion 3): each stream has its own q/k/v and output projections, and the attention
// runs over both streams' tokens together, so every token attends to every token of
// both streams:
//
//   qkv_x = x_qkv(x)  [B,Tx,3C]        x: the image stream, Tx tokens
//   qkv_c = c_qkv(c)  [B,Tc,3C]        c: the context (text) stream, Tc tokens
//   qkv   = per sequence, qkv_x's rows then qkv_c's [B,T,3C], T = Tx + Tc
//   a     = attention(qkv) [B,T,C]     bidirectional, 1/sqrt(HD) (Backend::attention_*)
//   out_x = x_proj(a[:, :Tx]),  out_c = c_proj(a[:, Tx:])
// SD3 puts the context's rows first; the order changes nothing (no position enters the
// attention itself) and kiln's puts the context last, so that a sequence's padded text
// slots are its last rows: cu_seqlens may then cut each sequence into the tokens that
// count (the image and the caption) and the padding, a document of its own that no real
// token sees (Backend::attention_varlen_forward).
// A pre-only context (SD3's last block: its context outputs are not used) has no c_proj
// and no out_c; its tokens still give keys and values.
//
// Saved (all recomputed with the block): qkv [B,T,3C], a [B,T,C] and the row log-sum-exp
// fp32 [B,NH,T] (never the [T,T] probabilities, as SelfAttention). No rotary, QK-norm,
// dropout, tensor or context parallelism yet.
#pragma once

#include "backend/backend.h"
#include "nn/attention.h"
#include "nn/linear.h"
#include "nn/saved.h"

#include <optional>
#include <string>
#include <vector>

namespace kiln::nn {

/// Scratch of one call: qkv_parts [B,T,W] (the two streams' projections, each a
/// contiguous [B,Ts,W] run; W = qkv_width, 3C without grouped heads), attn_parts [B,T,C]
/// (the two streams' rows of a), dattn [B,T,C] and dqkv [B,T,W].
struct JointAttentionScratch {
  Tensor qkv_parts, attn_parts, dattn, dqkv;
};

class JointAttention {
 public:
  /// Parameters <x_prefix>.qkv, <x_prefix>.proj, <c_prefix>.qkv and (unless
  /// context_pre_only) <c_prefix>.proj, each .weight [3C, C] / [C, C] N(0, init_std^2) and
  /// .bias 0 ([qkv_width, C] with grouped heads). Throws kiln::Error naming x_prefix when
  /// the spec is causal, rotary or has QK-norm, or NH * HD is not C.
  JointAttention(const std::string& x_prefix, const std::string& c_prefix, int64_t C,
                 const AttentionSpec& spec, float init_std, bool context_pre_only);

  enum : size_t { kQkv, kAttn, kLse, kNumSaved };
  std::vector<SavedSpec> saved_specs(int64_t B, int64_t Tx, int64_t Tc, DType dtype) const;
  JointAttentionScratch make_scratch(Backend& be, int64_t B, int64_t Tx, int64_t Tc,
                                     DType dtype) const;
  /// out_x [B,Tx,C] and out_c [B,Tc,C] (ignored when pre-only) from x [B,Tx,C] and c
  /// [B,Tc,C]; cu_seqlens int32 [D+1] over the B*T joint rows (see above) or empty (every
  /// token sees every token of its sequence).
  void forward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& out_x,
               const Tensor& out_c, const Tensor& x, const Tensor& c, const Tensor& cu_seqlens,
               const JointAttentionScratch& w) const;
  /// dx [B,Tx,C] and dc [B,Tc,C] (overwritten) from dout_x and dout_c (ignored when
  /// pre-only); parameter gradients accumulate.
  void backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dx,
                const Tensor& dc, const Tensor& dout_x, const Tensor& dout_c, const Tensor& x,
                const Tensor& c, const Tensor& cu_seqlens, const JointAttentionScratch& w) const;
  /// x_qkv, x_proj; c_qkv, c_proj (so that a block lists each stream's parameters together).
  void collect_x(std::vector<Param*>& out);
  void collect_c(std::vector<Param*>& out);

  bool context_pre_only() const { return !c_proj_; }
  /// Matmul weights an x position (4 C^2) and a context position (4 C^2, 3 C^2 pre-only)
  /// meet, for part balancing and FLOPs.
  double x_matmul_weights() const;
  double c_matmul_weights() const;

 private:
  /// Joint rows [B,T,W] <-> the two streams' [B,Tx,W], [B,Tc,W] (copy_columns on the
  /// sequences as rows of T*W values).
  void join(Backend& be, Stream s, const Tensor& joint, const Tensor& xs, const Tensor& cs) const;
  void split(Backend& be, Stream s, const Tensor& xs, const Tensor& cs, const Tensor& joint) const;
  AttentionSpec spec_;
  int64_t C_;
  Linear x_qkv_, x_proj_, c_qkv_;
  std::optional<Linear> c_proj_;
};

}  // namespace kiln::nn

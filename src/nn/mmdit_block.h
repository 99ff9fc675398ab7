// A multimodal diffusion transformer block (MMDiT: Esser et al. 2024, "Scaling Rectified
// Flow Transformers for High-Resolution Image Synthesis", Figure 2; Stable Diffusion 3's
// JointBlock): two token streams, the image's x [B,Tx,C] and the context's (text) c
// [B,Tc,C], each with its own adaLN-Zero modulation, norms, projections and MLP
// (nn/adaln_stream.h), meeting only in a joint attention (nn/joint_attention.h):
//
//   a_x, a_c   = the streams' pre parts (modulate(norm_1(.), shift_msa, scale_msa))
//   o_x, o_c   = joint_attention(a_x, a_c)
//   out_x      = x's post part (gates, residuals, MLP) on o_x; out_c likewise on o_c
// Both streams are modulated by the same conditioning vector c [B,C] (the timestep's
// embedding plus the pooled text), each through its own adaLN_modulation. With
// context_pre_only (SD3's last block) the context stream is its pre part alone: it gives
// keys and values and out_c is not computed.
//
// Parameters, named as SD3's (mmditx.py's JointBlock, under `prefix`):
//   x_block.{attn.qkv, attn.proj, mlp.fc1, mlp.fc2, adaLN_modulation.1}   (weight, bias)
//   context_block.{the same; pre-only: attn.qkv, adaLN_modulation.1 [2C, C]}
// Like AdaLNBlock it knows nothing of its position in a model, ranks or devices.
#pragma once

#include "nn/adaln_stream.h"
#include "nn/joint_attention.h"

#include <string>
#include <vector>

namespace kiln::nn {

struct MMDiTBlockSpec {
  int64_t n_embd = 0;  // C
  float norm_eps = 1e-6f;
  AttentionSpec attention;  // bidirectional, NH * HD = C
  int64_t mlp_hidden = 0;   // H (a GeluTanh MLP per stream)
  float init_std = 0.02f;   // attention and MLP weights N(0, init_std^2), biases 0
  bool context_pre_only = false;
};

/// The scratch of every block of a model: AdaLNScratch over the joint length T = Tx + Tc,
/// a second dmod [B,6,C] (the context stream's), and the joint attention's.
struct MMDiTScratch {
  AdaLNScratch common;
  Tensor dmod_c;
  JointAttentionScratch attn;
};

/// Per call: saved tensors, scratch, the shared conditioning silu(c) [B,C] and its
/// gradient accumulator dcond_silu [B,C] (+= by backward), the joint rows' documents
/// (JointAttention's cu_seqlens, or empty), checkpointing flags.
struct MMDiTPass {
  Backend& be;
  Stream s;
  std::span<const Tensor> saved;
  const MMDiTScratch& scratch;
  Tensor cond_silu, dcond_silu;
  Tensor cu_seqlens;
  bool rerun = false;            // backward re-runs forward first (full checkpointing)
  bool recompute_cheap = false;  // backward recomputes Cheap tensors first (selective)
};

class MMDiTBlock {
 public:
  /// `prefix` e.g. "joint_blocks.3.". Throws kiln::Error for an impossible spec (see
  /// AdaLNStream, JointAttention).
  MMDiTBlock(const std::string& prefix, const MMDiTBlockSpec& spec);

  /// Saved, in order: x's pre run, c's pre run, the attention's, x's post run, c's post
  /// run (empty when pre-only).
  std::vector<SavedSpec> saved_specs(int64_t B, int64_t Tx, int64_t Tc, DType dtype) const;
  MMDiTScratch make_scratch(Backend& be, int64_t B, int64_t Tx, int64_t Tc, DType dtype) const;
  /// out_x [B,Tx,C] and out_c [B,Tc,C] (not written when pre-only) from x and c (outputs
  /// must not alias inputs), filling the saved tensors.
  void forward(const MMDiTPass& p, const Tensor& x, const Tensor& c, const Tensor& out_x,
               const Tensor& out_c) const;
  /// dres_x [B,Tx,C] and dres_c [B,Tc,C] hold dL/dout_x and dL/dout_c on entry (dres_c
  /// must be zero when pre-only) and dL/dx, dL/dc on return; p.dcond_silu += dL/dsilu(c).
  void backward(const MMDiTPass& p, const Tensor& dres_x, const Tensor& dres_c, const Tensor& x,
                const Tensor& c, const Tensor& out_x, const Tensor& out_c) const;
  /// x_block's parameters (attention, MLP, adaLN), then context_block's.
  void collect(std::vector<Param*>& out);

  bool context_pre_only() const { return spec_.context_pre_only; }
  /// Matmul weights an image position and a context position meet (part balancing, FLOPs).
  double x_matmul_weights() const;
  double c_matmul_weights() const;

 private:
  AdaLNStreamPass stream_pass(const MMDiTPass& p) const {
    return {p.be, p.s, p.cond_silu, p.dcond_silu};
  }
  /// MMDiTPass::saved cut into its runs.
  struct Runs {
    std::span<const Tensor> xpre, cpre, attn, xpost, cpost;
  };
  Runs runs(std::span<const Tensor> saved) const;
  MMDiTBlockSpec spec_;
  AdaLNStream x_, c_;
  JointAttention attn_;
  // MMDiTPass::saved: x pre, c pre, attention, x post, c post.
  size_t kCPre = 0, kAttn = 0, kXPost = 0, kCPost = 0, kNumSaved = 0;
};

}  // namespace kiln::nn

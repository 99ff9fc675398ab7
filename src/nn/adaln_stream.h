// One token stream's part of an adaLN-Zero transformer block (Peebles & Xie 2023,
// "Scalable Diffusion Models with Transformers", 3.2): everything but the attention,
// which the block runs (its own self-attention in AdaLNBlock, the two streams' joint
// attention in MMDiTBlock):
//
//   mod [B,6,C] = adaLN_modulation(silu(c))     c [B,C], the conditioning vector
//               = shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp
//   pre:   a_in = modulate(norm_1(x), shift_msa, scale_msa)     the attention's input
//   (the block: a = attention's output projection of a_in, with the other stream's tokens)
//   post:  r    = x + gate_msa * a
//          out  = r + gate_mlp * mlp(modulate(norm_2(r), shift_mlp, scale_mlp))
//   modulate(h, shift, scale) = h * (1 + scale) + shift, broadcast over the T positions
// The norms have no gain or shift of their own (the modulation is their affine part);
// adaLN_modulation's weight and bias start at zero, so the stream starts as the identity.
//
// A pre-only stream (SD3's last context block, Esser et al. 2024) is the pre part alone:
// mod [B,2,C] = shift_msa, scale_msa, and no post part (its tokens' outputs are not used).
//
// Saved tensors come in two runs, the pre part's (pre_saved_specs) and the post part's
// (post_saved_specs); the block places them around its attention's in its own list.
// Knows nothing of ranks or devices; no dropout; no tensor parallelism yet.
#pragma once

#include "backend/backend.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/norm.h"
#include "nn/saved.h"

#include <optional>
#include <string>
#include <vector>

namespace kiln::nn {

struct AdaLNStreamSpec {
  int64_t n_embd = 0;  // C
  float norm_eps = 1e-6f;
  int64_t mlp_hidden = 0;  // H (the MLP is GeluTanh)
  float init_std = 0.02f;  // the MLP's weights N(0, init_std^2), biases 0
  bool pre_only = false;   // only the pre part (2 modulation chunks, no MLP)
};

/// The chunks of an adaLN modulation [B, M, C], in DiT's order.
enum AdaLNChunk : int { kShiftMsa = 0, kScaleMsa, kGateMsa, kShiftMlp, kScaleMlp, kGateMlp };

/// Backward scratch of a block, shared by its streams and by all blocks: tmp, dtmp, dtmp2
/// [B,T,C]; dattn [B,T,q_width]; dbig [B,T,max(H, qkv_width)]; dmod [B,6,C]; dcond [B,C]
/// (T the block's whole length).
struct AdaLNScratch {
  Tensor tmp, dtmp, dtmp2, dattn, dbig, dmod, dcond;
};

/// What a stream's calls share: the backend, saved tensors (its pre or post run), the
/// shared conditioning silu(c) [B,C] and its gradient accumulator dcond_silu [B,C] (+= by
/// pre_backward).
struct AdaLNStreamPass {
  Backend& be;
  Stream s;
  Tensor cond_silu, dcond_silu;
};

class AdaLNStream {
 public:
  /// `prefix` names the parameters (e.g. "blocks.3."): mlp.fc1, mlp.fc2 (each .weight,
  /// .bias) and adaLN_modulation.1.{weight [6C or 2C, C], bias}. Throws kiln::Error for
  /// a non-positive size.
  AdaLNStream(const std::string& prefix, const AdaLNStreamSpec& spec);

  /// The pre part's saved tensors: kMod [B,M,C], norm_1's, kAttnIn (the attention's
  /// input); the post part's: kAttnOut (the attention's output, written by the block),
  /// kResidual, norm_2's, kMlpIn, the MLP's, kMlpOut (none when pre-only).
  std::vector<SavedSpec> pre_saved_specs(int64_t B, int64_t T, DType dtype) const;
  std::vector<SavedSpec> post_saved_specs(int64_t B, int64_t T, DType dtype) const;
  size_t num_pre_saved() const { return kNumPre; }
  size_t num_post_saved() const { return kNumPost; }
  /// The attention's input in the pre run and its output in the post run.
  const Tensor& attention_input(std::span<const Tensor> pre) const { return pre[kAttnIn]; }
  const Tensor& attention_output(std::span<const Tensor> post) const { return post[kAttnOut]; }

  /// The pre part of x [B,T,C]: fills `pre`, attention_input(pre) among them.
  void pre_forward(const AdaLNStreamPass& p, std::span<const Tensor> pre, const Tensor& x) const;
  /// The post part: out [B,T,C] (must not alias x) from x and attention_output(post);
  /// `tmp` [B,T,C] scratch.
  void post_forward(const AdaLNStreamPass& p, std::span<const Tensor> pre,
                    std::span<const Tensor> post, const Tensor& x, const Tensor& out,
                    const Tensor& tmp) const;
  /// Refills the Cheap saved tensors of the post run (the MLP's activation).
  void recompute_cheap(const AdaLNStreamPass& p, std::span<const Tensor> post) const;
  /// The post part's backward: dres [B,T,C] holds dL/dout on entry and dL/dr on return
  /// (the gradient of the residual before the MLP, the attention's path not yet added);
  /// dattn_out [B,T,C] = dL/d attention output (overwritten). Scratch d1, d2 [B,T,C],
  /// dfc [B,T,H]; dmod [B,6,C] gets chunks 2..5.
  void post_backward(const AdaLNStreamPass& p, std::span<const Tensor> pre,
                     std::span<const Tensor> post, const Tensor& dres, const Tensor& dattn_out,
                     const Tensor& d1, const Tensor& d2, const Tensor& dfc,
                     const Tensor& dmod) const;
  /// The pre part's backward: dres [B,T,C] += dL/dx through the attention's input, from
  /// dattn_in [B,T,C] = dL/d attention_input (overwritten: used as scratch); dmod gets
  /// chunks 0 and 1, then the adaLN linear's backward reads all of them and
  /// p.dcond_silu += its input gradient (via dcond [B,C] scratch).
  void pre_backward(const AdaLNStreamPass& p, std::span<const Tensor> pre, const Tensor& dres,
                    const Tensor& dattn_in, const Tensor& x, const Tensor& dmod,
                    const Tensor& dcond) const;
  /// mlp then adaLN_modulation (the MLP absent when pre-only).
  void collect(std::vector<Param*>& out);

  /// Modulation chunks M: 6, or 2 when pre-only.
  int chunks() const { return spec_.pre_only ? 2 : 6; }
  /// The MLP's hidden width H (0 when pre-only).
  int64_t mlp_width() const { return mlp_ ? mlp_->fc_width() : 0; }
  /// Matmul weights a position meets here (the MLP's), for part balancing.
  double matmul_weights() const;
  const AdaLNStreamSpec& spec() const { return spec_; }

 private:
  AdaLNStreamSpec spec_;
  Norm norm_1_, norm_2_;
  std::optional<Mlp> mlp_;
  Linear adaln_;
  // Offsets in the pre and post runs (set by the constructor).
  size_t kMod = 0, kNorm1 = 0, kAttnIn = 0, kNumPre = 0;
  size_t kAttnOut = 0, kResidual = 0, kNorm2 = 0, kMlpIn = 0, kMlp = 0, kMlpOut = 0, kNumPost = 0;
};

}  // namespace kiln::nn

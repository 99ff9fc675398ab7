// A transformer block conditioned by adaptive layer norm with zero-initialised gates
// (adaLN-Zero, Peebles & Xie 2023, "Scalable Diffusion Models with Transformers", 3.2):
// one token stream (nn/adaln_stream.h: the modulation, norms, gates and MLP) around its
// own self-attention,
//
//   mod [B,6,C]  = adaLN_modulation(silu(c))        c [B,C], the conditioning vector
//   r   = x + gate_msa * attn(modulate(norm_1(x), shift_msa, scale_msa))
//   out = r + gate_mlp * mlp(modulate(norm_2(r), shift_mlp, scale_mlp))
// The caller computes silu(c) once for all blocks (AdaLNPass).
//
// Like TransformerBlock it knows nothing of its position in a model, ranks or devices: the
// model gives it its saved tensors (SavedActivations::block) and shared scratch per call.
// Attention is bidirectional unless the spec says otherwise; no dropout; no tensor
// parallelism yet.
#pragma once

#include "backend/backend.h"
#include "nn/adaln_stream.h"
#include "nn/attention.h"
#include "nn/saved.h"

#include <string>
#include <vector>

namespace kiln::nn {

struct AdaLNBlockSpec {
  int64_t n_embd = 0;  // C
  float norm_eps = 1e-6f;
  AttentionSpec attention;
  int64_t mlp_hidden = 0;  // H (a GeluTanh MLP)
  float init_std = 0.02f;  // attention and MLP weights N(0, init_std^2), biases 0
};

/// Per call: saved tensors, scratch, the shared conditioning silu(c) [B,C] and its
/// gradient accumulator dcond_silu [B,C] (+= by backward), checkpointing flags.
struct AdaLNPass {
  Backend& be;
  Stream s;
  std::span<const Tensor> saved;
  const AdaLNScratch& scratch;
  Tensor cond_silu, dcond_silu;
  bool rerun = false;            // backward re-runs forward first (full checkpointing)
  bool recompute_cheap = false;  // backward recomputes Cheap tensors first (selective)
};

class AdaLNBlock {
 public:
  /// `prefix` names the parameters (e.g. "blocks.3."): attn.qkv, attn.proj, mlp.fc1,
  /// mlp.fc2 (each .weight, .bias) and adaLN_modulation.1.{weight [6C, C], bias [6C]},
  /// as facebookresearch/DiT's DiTBlock.
  AdaLNBlock(const std::string& prefix, const AdaLNBlockSpec& spec);

  std::vector<SavedSpec> saved_specs(int64_t B, int64_t T, DType dtype) const;
  AdaLNScratch make_scratch(Backend& be, int64_t B, int64_t T, DType dtype) const;
  /// out [B,T,C] from x [B,T,C] (out must not alias x), filling the saved tensors.
  void forward(const AdaLNPass& p, const Tensor& x, const Tensor& out) const;
  /// dres [B,T,C] holds dL/dout on entry and dL/dx on return; p.dcond_silu += dL/dsilu(c).
  void backward(const AdaLNPass& p, const Tensor& dres, const Tensor& x, const Tensor& out) const;
  void collect(std::vector<Param*>& out);

  /// Cost of the matmuls per position, for part balancing (weights a position meets).
  double matmul_weights() const;

 private:
  AdaLNStreamPass stream_pass(const AdaLNPass& p) const {
    return {p.be, p.s, p.cond_silu, p.dcond_silu};
  }
  AdaLNBlockSpec spec_;
  AdaLNStream stream_;
  SelfAttention attn_;
  // AdaLNPass::saved: the stream's pre run, the attention's, the stream's post run.
  size_t kAttn = 0, kPost = 0, kNumSaved = 0;
};

}  // namespace kiln::nn

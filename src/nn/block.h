// A pre-norm transformer block composed from a plain spec (GPT-2: Radford et al. 2019;
// Llama: RMSNorm, rotary grouped-query attention, SwiGLU, no biases):
//   r   = x + dropout(attn(norm_1(x)))
//   out = r + dropout(mlp(norm_2(r)))
// The block knows nothing of its position in a model, ranks or devices: the model gives
// it, per call, its saved tensors (SavedActivations::block), shared scratch and the
// dropout masks of its three sites.
#pragma once

#include "backend/backend.h"
#include "nn/attention.h"
#include "nn/mlp.h"
#include "nn/norm.h"
#include "nn/saved.h"

#include <string>
#include <vector>

namespace kiln::nn {

/// Parameter names inside a block (defaults: Hugging Face GPT-2's).
struct BlockNames {
  std::string norm_1 = "ln_1", attn_qkv = "attn.c_attn", attn_out = "attn.c_proj";
  std::string norm_2 = "ln_2", mlp_fc = "mlp.c_fc", mlp_proj = "mlp.c_proj";
};

struct BlockSpec {
  int64_t n_embd = 0;               // C, the residual stream's width
  NormSpec norm;                    // both norms (kind, eps, gain, shift)
  AttentionSpec attention;
  MlpKind mlp = MlpKind::GeluTanh;
  int64_t mlp_hidden = 0;           // H
  bool bias = true;                 // biases on every Linear
  float init_std = 0.02f;           // weights N(0, init_std^2)
  float residual_init_std = 0.02f;  // the two projections into the residual stream
  BlockNames names;
};

/// Dropout sites of a block: each a distinct Philox stream (see the model's streams).
enum DropoutSite : uint64_t { kEmbeddingSite = 0, kAttnProbsSite = 1, kAttnResidSite = 2, kMlpResidSite = 3 };

/// Backward scratch shared by all blocks: tmp, dtmp, dattn [B,T,C]; dbig [B,T,max(MLP fc
/// width, qkv width)]; dact [B,T,H] (SwiGLU only, else empty).
struct BlockScratch {
  Tensor tmp, dtmp, dattn, dbig, dact;
};

/// Per-call inputs of a block besides x: saved tensors, scratch, dropout of each site.
struct BlockPass {
  Backend& be;
  Stream s;
  std::span<const Tensor> saved;
  const BlockScratch& scratch;
  DropoutSpec attn_probs, attn_resid, mlp_resid;
  bool rerun = false;           // backward re-runs forward first (full checkpointing)
  bool recompute_cheap = false;  // backward recomputes Cheap tensors first (selective)
  Tensor positions;             // int32 [B,T] for rotary attention; empty: 0..T-1
};

class TransformerBlock {
 public:
  /// `prefix` names the block's parameters (e.g. "transformer.h.3.").
  TransformerBlock(const std::string& prefix, const BlockSpec& spec);

  /// What forward saves for backward, in the order BlockPass::saved holds it.
  std::vector<SavedSpec> saved_specs(int64_t B, int64_t T, DType dtype) const;
  /// Scratch this block needs, in the model dtype.
  BlockScratch make_scratch(Backend& be, int64_t B, int64_t T, DType dtype) const;
  /// out [B,T,C] from x [B,T,C], filling the saved tensors. out must not alias x.
  void forward(const BlockPass& p, const Tensor& x, const Tensor& out) const;
  /// dres [B,T,C] holds dL/dout on entry and dL/dx on return. x and out are forward's
  /// (out is rewritten, bitwise equal, when the block is re-run).
  void backward(const BlockPass& p, const Tensor& dres, const Tensor& x, const Tensor& out) const;

  /// Inference scratch for decode(): Tq new positions of B sequences.
  struct DecodeScratch {
    Tensor x2, norm, y, qkv, hidden, act, mean, rstd;
  };
  DecodeScratch make_decode_scratch(Backend& be, int64_t B, int64_t Tq, DType dtype) const;
  /// x [B,Tq,C] <- block(x) over the KV caches [B,Tmax,NKV*HD] at positions
  /// past..past+Tq-1 (`positions` int32 [B,Tq] holds them for rotary attention).
  void decode(Backend& be, Stream s, const Tensor& x, const DecodeScratch& w,
              const Tensor& k_cache, const Tensor& v_cache, int64_t past,
              const Tensor& positions = Tensor()) const;

  void collect(std::vector<Param*>& out);
  const BlockSpec& spec() const { return spec_; }

 private:
  std::span<const Tensor> part(std::span<const Tensor> saved, size_t first, size_t n) const {
    return saved.subspan(first, n);
  }
  BlockSpec spec_;
  Norm norm_1_, norm_2_;
  SelfAttention attn_;
  Mlp mlp_;
  // Offsets of each layer's saved tensors in BlockPass::saved (set by the constructor).
  size_t kNorm1 = 0, kAttn = 0, kResidual = 0, kNorm2 = 0, kMlp = 0, kNumSaved = 0;
};

}  // namespace kiln::nn

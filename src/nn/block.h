// A pre-norm transformer block composed from a plain spec (GPT-2: Radford et al. 2019;
// Llama: RMSNorm, rotary grouped-query attention, SwiGLU, no biases):
//   r   = x + dropout(attn(norm_1(x)))
//   out = r + dropout(mlp(norm_2(r)))
// where mlp is a dense Mlp, or a mixture of experts (MoeMlp, nn/moe.h) when the spec's
// `moe` has experts; the dense path is the same code either way.
// The block knows nothing of its position in a model, ranks or devices: the model gives
// it, per call, its saved tensors (SavedActivations::block), shared scratch and the
// dropout masks of its three sites.
//
// Tensor parallel (shard()): the block installs the placements the model's plan table
// gives it (BlockPlacement: models/layer_plan.h's table, made into placements by
// parallel/tp_plan.h) on its norms, attention and MLP, and chooses none itself. Under the
// decoders' plan (Megatron-LM) attention heads and MLP hidden units split over the tp
// group, each half a column-parallel Linear then a row-parallel one, so the block makes
// two reductions forward and two backward (a MoE block's experts split as the MLP's
// hidden units, its router whole on every rank: nn/moe.h; its shared experts reduce
// apart, one reduction more each way). Without sequence parallelism the residual
// stream x, out [B,T,C] is whole on every rank; with it (Korthikanti et al. 2022; the
// norms' style Sequence) a rank holds rows [r BT/tp, (r+1) BT/tp) of the flattened
// stream, x and out are [BT/tp, C], the norms run on those rows (their parameter
// gradients become partial sums over tp) and the reductions become all_gather /
// reduce_scatter pairs.
#pragma once

#include "backend/backend.h"
#include "nn/attention.h"
#include "nn/mlp.h"
#include "nn/moe.h"
#include "nn/norm.h"
#include "nn/saved.h"

#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kiln::nn {

/// Parameter names inside a block (defaults: Hugging Face GPT-2's); the QK-norm gains'
/// only with AttentionSpec::qk_norm.
struct BlockNames {
  std::string norm_1 = "ln_1", attn_qkv = "attn.c_attn", attn_out = "attn.c_proj";
  std::string norm_2 = "ln_2", mlp_fc = "mlp.c_fc", mlp_proj = "mlp.c_proj";
  std::string attn_q_norm = "attn.q_norm", attn_k_norm = "attn.k_norm";
  std::string moe = "mlp";  // a MoE layer's prefix (nn/moe.h names its parameters)
};

struct BlockSpec {
  int64_t n_embd = 0;               // C, the residual stream's width
  NormSpec norm;                    // both norms (kind, eps, gain, shift)
  AttentionSpec attention;          // NH * HD need not be C
  MlpKind mlp = MlpKind::GeluTanh;
  int64_t mlp_hidden = 0;           // H
  bool bias = true;                 // biases on every Linear
  float init_std = 0.02f;           // weights N(0, init_std^2)
  float residual_init_std = 0.02f;  // the two projections into the residual stream
  BlockNames names;
  MoeSpec moe;                      // experts > 0: a MoeMlp in place of the Mlp (SwiGLU
                                    // experts of width moe.expert_hidden; mlp_hidden unused)
};

/// Where the tensor-parallel plan puts a block's layers: both norms (Sequence or
/// Replicated), the attention's and the MLP's Linears (each pair Column then Row, or both
/// Replicated). One group for all.
struct BlockPlacement {
  TpPlacement norms;
  AttentionPlacement attention;
  MlpPlacement mlp;
};

/// Dropout sites of a block: each a distinct Philox stream (see the model's streams).
enum DropoutSite : uint64_t { kEmbeddingSite = 0, kAttnProbsSite = 1, kAttnResidSite = 2, kMlpResidSite = 3 };

/// Backward scratch shared by all blocks: tmp, dtmp [B,T,C]; dattn [B,T,NH*HD] (twice as
/// wide with QK-norm: SelfAttention::dattn_width); dbig
/// [B,T,max(MLP fc width, qkv width)]; dact [B,T,H] (SwiGLU only, else empty); work
/// [B*T, C] under sequence parallelism (else empty). Widths are the rank's when sharded.
/// moe: a MoE block's (nn/moe.h; empty for a dense one).
struct BlockScratch {
  Tensor tmp, dtmp, dattn, dbig, dact, work;
  MoeScratch moe = {};
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
  Tensor cu_seqlens;            // int32 [D+1]: documents packed into the sequences; empty:
                                // one per sequence (SelfAttention::forward)
  MoeBalancePass balance = {};  // a MoE block's balancing-loss buffers and scales
};

class TransformerBlock {
 public:
  /// `prefix` names the block's parameters (e.g. "transformer.h.3.").
  TransformerBlock(const std::string& prefix, const BlockSpec& spec);

  /// Installs the plan's placements on the block's layers (see the top of this file).
  /// Call before the model lays out its parameters. Throws kiln::Error naming the layer
  /// for a style it cannot take, when heads, key/value heads or hidden units do not divide
  /// over the group, or for sequence parallelism without sequence-parallel norms and a
  /// split attention and MLP.
  void shard(const BlockPlacement& placement);
  /// Runs the block's attention as ring attention over `group` (nn/context_parallel.h).
  void set_context_parallel(CpGroup& group) { attn_.set_context_parallel(group); }
  /// Whether the residual stream is split in rows (sequence parallel over tp > 1).
  bool sequence_parallel() const { return tp_ && sp_; }
  /// The residual stream's shape for a [B, T] batch: [B,T,C], or this rank's [BT/tp, C]
  /// rows under sequence parallelism; residual_bt() gives it as (B', T') = (B, T) or
  /// (1, BT/tp), for the saved specs of a norm on the stream.
  Shape residual_shape(int64_t B, int64_t T) const;
  std::pair<int64_t, int64_t> residual_bt(int64_t B, int64_t T) const;
  /// What forward saves for backward, in the order BlockPass::saved holds it.
  std::vector<SavedSpec> saved_specs(int64_t B, int64_t T, DType dtype) const;
  /// Scratch this block needs, in the model dtype.
  BlockScratch make_scratch(Backend& be, int64_t B, int64_t T, DType dtype) const;
  /// Scratch that serves every one of `blocks` (dense and MoE blocks mixed): the first
  /// dense block's (all dense blocks of a model have one shape) with the first MoE
  /// block's MoE part.
  static BlockScratch make_scratch(Backend& be, std::span<const TransformerBlock> blocks,
                                   int64_t B, int64_t T, DType dtype);
  /// out [B,T,C] from x [B,T,C] ([BT/tp, C] each under sequence parallelism), filling the
  /// saved tensors. out must not alias x.
  void forward(const BlockPass& p, const Tensor& x, const Tensor& out) const;
  /// dres [B,T,C] holds dL/dout on entry and dL/dx on return. x and out are forward's
  /// (out is rewritten, bitwise equal, when the block is re-run).
  void backward(const BlockPass& p, const Tensor& dres, const Tensor& x, const Tensor& out) const;

  /// Inference scratch for decode(): Tq new positions of B sequences.
  struct DecodeScratch {
    Tensor x2, norm, y, qkv, attn, hidden, act, mean, rstd;
  };
  DecodeScratch make_decode_scratch(Backend& be, int64_t B, int64_t Tq, DType dtype) const;
  /// x [B,Tq,C] <- block(x) over the KV caches [B,Tmax,NKV*HD] at positions
  /// past..past+Tq-1 (`positions` int32 [B,Tq] holds them for rotary attention).
  void decode(Backend& be, Stream s, const Tensor& x, const DecodeScratch& w,
              const Tensor& k_cache, const Tensor& v_cache, int64_t past,
              const Tensor& positions = Tensor()) const;

  void collect(std::vector<Param*>& out);
  const BlockSpec& spec() const { return spec_; }
  /// The block's dense Linears by role (not the experts or the router of a MoE block),
  /// for a plan that changes how they compute (train.fp8, train.lora).
  struct RoleLinear {
    const char* role;  // "attention.qkv", "attention.proj", "mlp.fc", "mlp.proj" (the
                       // tensor-parallel table's roles, models/layer_plan.h)
    Linear* linear;
  };
  std::vector<RoleLinear> linears();
  /// The block's mixture of experts; nullptr for a dense block.
  const MoeMlp* moe() const { return moe_ ? &*moe_ : nullptr; }
  MoeMlp* moe() { return moe_ ? &*moe_ : nullptr; }

 private:
  /// forward(); `recomputing` when backward re-runs it (no balancing statistics added).
  void run(const BlockPass& p, const Tensor& x, const Tensor& out, bool recomputing) const;
  /// The feed-forward half's backward: dtmp (overwritten) from d_out.
  void mlp_backward(const BlockPass& p, const Tensor& dtmp, const Tensor& d_out,
                    const Tensor& inp) const;
  /// A residual-stream dropout spec at this rank's global rows (sequence parallel).
  DropoutSpec rows(const DropoutSpec& d, const Tensor& x) const;
  std::span<const Tensor> part(std::span<const Tensor> saved, size_t first, size_t n) const {
    return saved.subspan(first, n);
  }
  BlockSpec spec_;
  TpGroup* tp_ = nullptr;  // set by shard() when a placement is active (tp > 1)
  bool sp_ = false;        // the residual stream split in rows (sequence parallel)
  Norm norm_1_, norm_2_;
  SelfAttention attn_;
  std::optional<Mlp> mlp_;     // a dense block
  std::optional<MoeMlp> moe_;  // a mixture-of-experts block
  // Offsets of each layer's saved tensors in BlockPass::saved (set by the constructor).
  size_t kNorm1 = 0, kAttn = 0, kResidual = 0, kNorm2 = 0, kMlp = 0, kNumSaved = 0;
};

}  // namespace kiln::nn

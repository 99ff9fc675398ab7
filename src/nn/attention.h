// Self-attention (Vaswani et al. 2017) as a layer: a fused q/k/v projection, the
// attention op of the backend, and the output projection.
//
// q, k and v are column ranges of ONE buffer qkv [B, T, (NH + 2 NKV) * HD]: q in columns
// [0, NH*HD), k in [NH*HD, (NH+NKV)*HD), v after, each head's HD columns contiguous (the
// layout of GPT-2's c_attn output), so a fused projection needs no copy.
// Saved (all recomputed with the block): qkv (rotated, with rotary), the attention
// output [B,T,NH*HD] (the output projection's input) and the row log-sum-exp fp32
// [B,NH,T]; never the [T,T] probabilities (FlashAttention: Dao et al. 2022).
//
// Tensor parallel (shard()): the layer takes the placements of its two Linears from the
// model's plan table (models/layer_plan.h, applied by parallel/tp_plan.h) and chooses none
// itself. Column then row (the decoders' plan, Megatron-LM): each tp rank computes NH/tp
// query heads over NKV/tp key/value heads, the fused projection split in its q, k and v
// pieces separately (a layout fact of this layer) and the output projection's input
// features split; saved tensors are the rank's heads. Both replicated: the whole layer on
// every rank.
// Context parallel (set_context_parallel(), installed by parallel/context_parallel.h where
// the model's context-parallel table puts attention on the ring): the rank's rows of every
// sequence attend to the whole sequence by ring attention (nn/context_parallel.h); saved
// tensors stay the rank's rows, so they shrink as 1/cp.
#pragma once

#include "backend/backend.h"
#include "nn/context_parallel.h"
#include "nn/linear.h"
#include "nn/saved.h"

#include <vector>

namespace kiln::nn {

/// An attention layer's shape (AttentionShape: NH query heads over NKV key/value heads,
/// head size HD, causal or bidirectional) and its position encoding: rotary (Su et al.
/// 2021, applied to q and k after the projection, at the batch's positions) or none.
struct AttentionSpec : AttentionShape {
  bool rotary = false;
  RopeSpec rope;
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
  /// projections by 1/sqrt(2 n_layer)).
  SelfAttention(const std::string& qkv_name, const std::string& out_name, int64_t C,
                const AttentionSpec& spec, bool bias, float init_std, float out_init_std);

  /// Installs the plan's placements. qkv Column and proj Row split the heads over their
  /// group (sequence parallel as the placements say); both Replicated leave the layer
  /// whole. Throws kiln::Error naming the layer for another pair of styles, or unless NH
  /// and NKV divide by the group's size.
  void shard(const AttentionPlacement& placement);
  /// Attends over the sequences split across `group` (ring attention). Forward then
  /// refuses attention dropout with a kiln::Error.
  void set_context_parallel(CpGroup& group) { cp_ = group.size() > 1 ? &group : nullptr; }
  std::vector<SavedSpec> saved_specs(int64_t B, int64_t T, DType dtype) const;
  enum : size_t { kQkv, kAttn, kLse, kNumSaved };
  /// out [B,T,C] = proj(attention(rope(qkv(inp)))), inp [B,T,C]; positions int32 [B,T]
  /// or empty (0..T-1) for the rotary angles; dropout on the probabilities.
  /// Sharded: inp and out are the rank's rows under sequence parallelism, `work` [B*T, C]
  /// scratch (Linear).
  void forward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& out,
               const Tensor& inp, const Tensor& positions, const DropoutSpec& dropout,
               const Tensor& work = Tensor()) const;
  /// dinp [B,T,C] (overwritten) from dout [B,T,C]; parameter gradients accumulate.
  /// Scratch: dattn [B,T,NH*HD], dqkv [B,T,qkv_width] (the rank's heads when sharded).
  void backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dinp,
                const Tensor& dout, const Tensor& inp, const Tensor& dattn, const Tensor& dqkv,
                const Tensor& positions, const DropoutSpec& dropout,
                const Tensor& work = Tensor()) const;
  /// Inference over a KV cache (see Backend::attention_decode): inp [B,Tq,C] at
  /// positions past.. (`positions` int32 [B,Tq] holds them when rotary; may be empty
  /// otherwise), out [B,Tq,C]; scratch qkv [B,Tq,qkv_width], attn [B,Tq,NH*HD].
  void decode(Backend& be, Stream s, const Tensor& out, const Tensor& inp, const Tensor& qkv,
              const Tensor& attn, const Tensor& k_cache, const Tensor& v_cache, int64_t past,
              const Tensor& positions) const;
  void collect(std::vector<Param*>& out);

  const AttentionSpec& spec() const { return spec_; }
  /// The heads this rank computes (spec() unless sharded).
  const AttentionSpec& local_spec() const { return local_; }
  Linear qkv, proj;

 private:
  /// The probabilities' dropout at global heads (this rank's first head among NH).
  DropoutSpec at_heads(const DropoutSpec& d) const;
  AttentionSpec spec_, local_;
  int first_head_ = 0;  // this rank's first query head
  CpGroup* cp_ = nullptr;  // a context-parallel group of more than one rank
};

}  // namespace kiln::nn

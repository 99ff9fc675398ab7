// The transformer's MLP: y = proj(act(fc(x))), hidden width H.
//
// GeluTanh (GPT-2): fc [H, C], act = GELU with the tanh approximation (Hendrycks &
//   Gimpel 2016); H = 4C in GPT-2.
// SwiGLU (Shazeer 2020; Llama): fc [2H, C] is the gate projection (rows [0, H)) and the
//   up projection (rows [H, 2H)) fused into one Linear, act = silu(gate) * up.
// Saved: fc's output [B,T,H or 2H] (recomputed with the block) and act's output [B,T,H],
// which is Cheap: one elementwise op recomputes it from fc's output, so selective
// checkpointing drops it (Korthikanti et al. 2022, section 5).
// Tensor parallel (shard()): the layer takes the placements of its two Linears from the
// model's plan table (models/layer_plan.h, applied by parallel/tp_plan.h) and chooses none
// itself. fc column- then proj row-parallel (the decoders' plan, Megatron-LM): each rank
// computes H/tp hidden units, SwiGLU's gate and up pieces split separately (a layout fact
// of this layer), so a rank holds [gate_r; up_r]. Both replicated: the whole layer on
// every rank.
#pragma once

#include "backend/backend.h"
#include "nn/linear.h"
#include "nn/saved.h"

#include <vector>

namespace kiln::nn {

enum class MlpKind { GeluTanh, SwiGLU };

/// Where the tensor-parallel plan puts the layer's two Linears: fc Column and proj Row
/// (hidden units split), or both Replicated.
struct MlpPlacement {
  TpPlacement fc, proj;
};

class Mlp {
 public:
  /// <fc_name> [H or 2H, C] and <proj_name> [C, H] (init proj_init_std), biases when `bias`.
  Mlp(MlpKind kind, const std::string& fc_name, const std::string& proj_name, int64_t C,
      int64_t H, bool bias, float init_std, float proj_init_std);

  /// Installs the plan's placements: fc Column and proj Row split the hidden units over
  /// their group; both Replicated leave the layer whole. Throws kiln::Error naming the
  /// layer for another pair of styles, or unless H divides by the group's size.
  void shard(const MlpPlacement& placement);
  std::vector<SavedSpec> saved_specs(int64_t B, int64_t T, DType dtype) const;
  enum : size_t { kHidden, kAct, kNumSaved };
  /// out [B,T,C] = proj(act(fc(inp))). Sharded: inp and out are the rank's rows under
  /// sequence parallelism, `work` [B*T, C] scratch (Linear).
  void forward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& out,
               const Tensor& inp, const Tensor& work = Tensor()) const;
  /// Refills the Cheap saved tensor (the activation) from fc's output.
  void recompute(Backend& be, Stream s, std::span<const Tensor> saved) const;
  /// dinp [B,T,C] (overwritten) from dout. Scratch: dfc [B,T,fc_width()]; SwiGLU also
  /// dact [B,T,H] (GeluTanh works in place in dfc and ignores it).
  void backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dinp,
                const Tensor& dout, const Tensor& inp, const Tensor& dfc, const Tensor& dact,
                const Tensor& work = Tensor()) const;
  /// Inference: out = proj(act(fc(inp))) with scratch hidden [B,Tq,fc_width()], act
  /// [B,Tq,H].
  void decode(Backend& be, Stream s, const Tensor& out, const Tensor& inp, const Tensor& hidden,
              const Tensor& act) const;
  void collect(std::vector<Param*>& out);

  MlpKind kind() const { return kind_; }
  int64_t hidden() const { return proj.local_in(); }   // H (H/tp on a tp rank)
  int64_t fc_width() const { return fc.local_out(); }  // H, or 2H for SwiGLU (per rank)
  Linear fc, proj;

 private:
  void activate(Backend& be, Stream s, const Tensor& act, const Tensor& hidden) const;
  MlpKind kind_;
};

}  // namespace kiln::nn

// The transformer's MLP: y = proj(act(fc(x))).
//
// GeluMlp (GPT-2): act = GELU with the tanh approximation (Hendrycks & Gimpel 2016),
// hidden width H (4C in GPT-2). Saved: the hidden pre-activation h [B,T,H] (recomputed
// with the block) and act(h) [B,T,H], which is Cheap: one elementwise op recomputes it
// from h, so selective checkpointing drops it (Korthikanti et al. 2022, section 5).
#pragma once

#include "backend/backend.h"
#include "nn/linear.h"
#include "nn/saved.h"

#include <vector>

namespace kiln::nn {

class GeluMlp {
 public:
  /// <fc_name> [H, C] and <proj_name> [C, H] (init proj_init_std), biases when `bias`.
  GeluMlp(const std::string& fc_name, const std::string& proj_name, int64_t C, int64_t H,
          bool bias, float init_std, float proj_init_std);

  std::vector<SavedSpec> saved_specs(int64_t B, int64_t T, DType dtype) const;
  enum : size_t { kHidden, kAct, kNumSaved };
  /// out [B,T,C] = proj(gelu(fc(inp))).
  void forward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& out,
               const Tensor& inp) const;
  /// Refills the Cheap saved tensor (the activation) from the hidden pre-activation.
  void recompute(Backend& be, Stream s, std::span<const Tensor> saved) const;
  /// dinp [B,T,C] (overwritten) from dout; scratch dhidden [B,T,H].
  void backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dinp,
                const Tensor& dout, const Tensor& inp, const Tensor& dhidden) const;
  /// Inference: out = proj(gelu(fc(inp))) with scratch hidden, act [B,Tq,H].
  void decode(Backend& be, Stream s, const Tensor& out, const Tensor& inp, const Tensor& hidden,
              const Tensor& act) const;
  void collect(std::vector<Param*>& out);

  int64_t hidden() const { return fc.out(); }
  Linear fc, proj;
};

}  // namespace kiln::nn

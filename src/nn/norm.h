// Normalisation over the last dimension, one layer for both kinds a block may use:
//
// LayerNorm (Ba, Kiros, Hinton 2016, as torch.nn.LayerNorm): y = (x - mean) * rstd * g + b,
//   rstd = 1 / sqrt(biased var + eps). Saves out, mean and rstd (fp32 [N]).
// RMSNorm (Zhang & Sennrich 2019, as Llama's): y = x * rstd * g, rstd = 1 / sqrt(mean(x^2)
//   + eps). Saves out and rstd.
// The gain g (<name>.weight, ones) and, for LayerNorm, the shift b (<name>.bias, zeros)
// are optional (NormSpec). All saved tensors are recomputed with the block.
#pragma once

#include "backend/backend.h"
#include "nn/param.h"
#include "nn/saved.h"

#include <vector>

namespace kiln::nn {

enum class NormKind { LayerNorm, RMSNorm };

struct NormSpec {
  NormKind kind = NormKind::LayerNorm;
  float eps = 1e-5f;
  bool weight = true;  // a learned gain
  bool bias = true;    // a learned shift (LayerNorm only)
};

class Norm {
 public:
  Norm(const std::string& name, int64_t C, const NormSpec& spec);

  /// Saved, in order: out [B,T,C] (model dtype) first (kOut), then the fp32 [B*T]
  /// statistics (LayerNorm: mean, rstd; RMSNorm: rstd).
  std::vector<SavedSpec> saved_specs(int64_t B, int64_t T, DType dtype) const;
  static constexpr size_t kOut = 0;
  size_t num_saved() const { return spec_.kind == NormKind::LayerNorm ? 3 : 2; }
  /// saved[kOut] = norm(inp), inp [B,T,C]; fills the statistics.
  void forward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& inp) const;
  /// As forward, into explicit buffers (inference: nothing is saved); mean is unused by
  /// RMSNorm.
  void forward_into(Backend& be, Stream s, const Tensor& out, const Tensor& mean,
                    const Tensor& rstd, const Tensor& inp) const;
  /// dinp [B,T,C] += dnorm(dout) (adds: inp is the residual stream); gain and shift
  /// gradients +=.
  void backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dinp,
                const Tensor& dout, const Tensor& inp) const;
  /// As backward, from explicit statistics (forward_into's; mean unused by RMSNorm).
  void backward_from(Backend& be, Stream s, const Tensor& dinp, const Tensor& dout,
                     const Tensor& inp, const Tensor& mean, const Tensor& rstd) const;
  void collect(std::vector<Param*>& out);
  /// Installs the plan's placement: Replicated, or Sequence (TpStyle), under which with
  /// sequence parallelism (placement.sequence_parallel, tp > 1) a rank normalises only its
  /// rows, so its gain and shift gradients are partial sums over tp
  /// (Param::tp_partial_grad). Throws kiln::Error naming the gain for another style.
  void shard(const TpPlacement& placement);

  const NormSpec& spec() const { return spec_; }
  /// The gain's name: "<name>.weight" (even when there is no gain: for messages).
  const std::string& name() const { return weight.name; }
  Param weight, bias;  // empty name and shape when absent

 private:
  Tensor opt_value(const Param& p) const { return p.shape.ndim() ? p.v() : Tensor(); }
  /// The gradient of a gain or shift: empty when absent; when frozen, a zeroed [C]
  /// scratch that the backend's fused kernel writes and nothing reads.
  Tensor opt_grad(Backend& be, Stream s, const Param& p) const;
  int64_t C_;
  NormSpec spec_;
};

}  // namespace kiln::nn

// Normalisation layers over the last dimension.
//
// LayerNorm (Ba, Kiros, Hinton 2016, as torch.nn.LayerNorm): y = (x - mean) * rstd * g + b
// with rstd = 1 / sqrt(biased var + eps). It saves its output (the next Linear's input),
// mean and rstd (fp32 [N]), all recomputed with the block.
#pragma once

#include "backend/backend.h"
#include "nn/param.h"
#include "nn/saved.h"

#include <vector>

namespace kiln::nn {

class LayerNorm {
 public:
  /// Parameters <name>.weight [C] (ones) and <name>.bias [C] (zeros). The backend's
  /// LayerNorm op is affine with a bias, so both always exist for now.
  LayerNorm(const std::string& name, int64_t C, float eps);

  /// Saved: out [B,T,C] (model dtype), mean, rstd fp32 [B*T], in this order.
  std::vector<SavedSpec> saved_specs(int64_t B, int64_t T, DType dtype) const;
  enum : size_t { kOut, kMean, kRstd, kNumSaved };
  /// saved[kOut] = LN(inp), inp [B,T,C]; fills mean and rstd.
  void forward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& inp) const;
  /// As forward, into explicit buffers (inference: nothing is saved).
  void forward_into(Backend& be, Stream s, const Tensor& out, const Tensor& mean,
                    const Tensor& rstd, const Tensor& inp) const;
  /// dinp [B,T,C] += dLN(dout) (adds: inp is the residual stream); dweight, dbias +=.
  void backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dinp,
                const Tensor& dout, const Tensor& inp) const;
  void collect(std::vector<Param*>& out);

  Param weight, bias;

 private:
  int64_t C_;
  float eps_;
};

}  // namespace kiln::nn

// Linear: y = x W^T + b, the layer of torch.nn.Linear (weight stored [out, in]).
#pragma once

#include "backend/backend.h"
#include "nn/param.h"

#include <vector>

namespace kiln::nn {

class Linear {
 public:
  /// `name` is the global prefix (e.g. transformer.h.0.attn.c_attn): parameters
  /// <name>.weight [out, in] (decays, initialised N(0, init_std^2)) and, with `bias`,
  /// <name>.bias [out] (zeros).
  Linear(const std::string& name, int64_t in, int64_t out, bool bias, float init_std);

  /// out [N, out] = inp [N, in] @ weight^T (+ bias). Any leading dims flatten to N.
  void forward(Backend& be, Stream s, const Tensor& out, const Tensor& inp) const;
  /// dinp [N, in] = dout @ weight (overwritten; skipped when empty);
  /// dweight += dout^T @ inp; dbias += column sums of dout.
  void backward(Backend& be, Stream s, const Tensor& dinp, const Tensor& dout,
                const Tensor& inp) const;
  void collect(std::vector<Param*>& out);

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  bool has_bias() const { return has_bias_; }
  Param weight, bias;

 private:
  int64_t in_, out_;
  bool has_bias_;
};

}  // namespace kiln::nn

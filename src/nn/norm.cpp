#include "nn/norm.h"

namespace kiln::nn {

LayerNorm::LayerNorm(const std::string& name, int64_t C, float eps)
    : weight(name + ".weight", Shape{C}, Init::ones(), false),
      bias(name + ".bias", Shape{C}, Init::zeros(), false), C_(C), eps_(eps) {}

std::vector<SavedSpec> LayerNorm::saved_specs(int64_t B, int64_t T, DType dtype) const {
  return {{weight.name + ":out", Shape{B, T, C_}, dtype, Recompute::WithBlock},
          {weight.name + ":mean", Shape{B * T}, DType::F32, Recompute::WithBlock},
          {weight.name + ":rstd", Shape{B * T}, DType::F32, Recompute::WithBlock}};
}

void LayerNorm::forward(Backend& be, Stream s, std::span<const Tensor> saved,
                        const Tensor& inp) const {
  forward_into(be, s, saved[kOut], saved[kMean], saved[kRstd], inp);
}

void LayerNorm::forward_into(Backend& be, Stream s, const Tensor& out, const Tensor& mean,
                             const Tensor& rstd, const Tensor& inp) const {
  be.layernorm_forward(s, out, mean, rstd, inp, weight.v(), bias.v(), eps_);
}

void LayerNorm::backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dinp,
                         const Tensor& dout, const Tensor& inp) const {
  be.layernorm_backward(s, dinp, weight.g(), bias.g(), dout, inp, weight.v(), saved[kMean],
                        saved[kRstd]);
}

void LayerNorm::collect(std::vector<Param*>& out) {
  out.push_back(&weight);
  out.push_back(&bias);
}

}  // namespace kiln::nn

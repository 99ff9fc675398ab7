#include "nn/linear.h"

namespace kiln::nn {

Linear::Linear(const std::string& name, int64_t in, int64_t out, bool bias, float init_std)
    : weight(name + ".weight", Shape{out, in}, Init::normal(init_std), true),
      in_(in), out_(out), has_bias_(bias) {
  if (bias) this->bias = Param(name + ".bias", Shape{out}, Init::zeros(), false);
}

void Linear::forward(Backend& be, Stream s, const Tensor& out, const Tensor& inp) const {
  be.linear_forward(s, out, inp, weight.v(), has_bias_ ? bias.v() : Tensor());
}

void Linear::backward(Backend& be, Stream s, const Tensor& dinp, const Tensor& dout,
                      const Tensor& inp) const {
  be.linear_backward(s, dinp, weight.g(), has_bias_ ? bias.g() : Tensor(), dout, inp, weight.v());
}

void Linear::collect(std::vector<Param*>& out) {
  out.push_back(&weight);
  if (has_bias_) out.push_back(&bias);
}

}  // namespace kiln::nn

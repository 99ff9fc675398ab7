#include "nn/mlp.h"

namespace kiln::nn {

GeluMlp::GeluMlp(const std::string& fc_name, const std::string& proj_name, int64_t C, int64_t H,
                 bool bias, float init_std, float proj_init_std)
    : fc(fc_name, C, H, bias, init_std), proj(proj_name, H, C, bias, proj_init_std) {}

std::vector<SavedSpec> GeluMlp::saved_specs(int64_t B, int64_t T, DType dtype) const {
  return {{fc.weight.name + ":out", Shape{B, T, hidden()}, dtype, Recompute::WithBlock},
          {proj.weight.name + ":in", Shape{B, T, hidden()}, dtype, Recompute::Cheap}};
}

void GeluMlp::forward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& out,
                      const Tensor& inp) const {
  fc.forward(be, s, saved[kHidden], inp);
  be.gelu_forward(s, saved[kAct], saved[kHidden]);
  proj.forward(be, s, out, saved[kAct]);
}

void GeluMlp::recompute(Backend& be, Stream s, std::span<const Tensor> saved) const {
  be.gelu_forward(s, saved[kAct], saved[kHidden]);
}

void GeluMlp::backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dinp,
                       const Tensor& dout, const Tensor& inp, const Tensor& dhidden) const {
  proj.backward(be, s, dhidden, dout, saved[kAct]);
  be.gelu_backward(s, dhidden, dhidden, saved[kHidden]);
  fc.backward(be, s, dinp, dhidden, inp);
}

void GeluMlp::decode(Backend& be, Stream s, const Tensor& out, const Tensor& inp,
                     const Tensor& hidden, const Tensor& act) const {
  fc.forward(be, s, hidden, inp);
  be.gelu_forward(s, act, hidden);
  proj.forward(be, s, out, act);
}

void GeluMlp::collect(std::vector<Param*>& out) {
  fc.collect(out);
  proj.collect(out);
}

}  // namespace kiln::nn

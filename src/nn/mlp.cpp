#include "nn/mlp.h"

namespace kiln::nn {

Mlp::Mlp(MlpKind kind, const std::string& fc_name, const std::string& proj_name, int64_t C,
         int64_t H, bool bias, float init_std, float proj_init_std)
    : fc(fc_name, C, kind == MlpKind::SwiGLU ? 2 * H : H, bias, init_std,
         kind == MlpKind::SwiGLU ? std::vector<LinearPiece>{{"gate", H}, {"up", H}}
                                 : std::vector<LinearPiece>{}),
      proj(proj_name, H, C, bias, proj_init_std), kind_(kind) {}

void Mlp::shard(const MlpPlacement& placement) {
  if (!column_row_split(placement.fc, placement.proj, fc.weight.name)) return;
  // SwiGLU's gate and up (fc's pieces) split separately: a rank holds its units of each.
  fc.shard(placement.fc);
  proj.shard(placement.proj);
}

std::vector<SavedSpec> Mlp::saved_specs(int64_t B, int64_t T, DType dtype) const {
  return {{fc.weight.name + ":out", Shape{B, T, fc_width()}, dtype, Recompute::WithBlock},
          {proj.weight.name + ":in", Shape{B, T, hidden()}, dtype, Recompute::Cheap}};
}

void Mlp::activate(Backend& be, Stream s, const Tensor& act, const Tensor& hidden) const {
  if (kind_ == MlpKind::GeluTanh)
    be.gelu_forward(s, act, hidden);
  else
    be.swiglu_forward(s, act, hidden);
}

void Mlp::forward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& out,
                  const Tensor& inp, const Tensor& work) const {
  fc.forward(be, s, saved[kHidden], inp, work);
  activate(be, s, saved[kAct], saved[kHidden]);
  proj.forward(be, s, out, saved[kAct], work);
}

void Mlp::recompute(Backend& be, Stream s, std::span<const Tensor> saved) const {
  activate(be, s, saved[kAct], saved[kHidden]);
}

void Mlp::backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dinp,
                   const Tensor& dout, const Tensor& inp, const Tensor& dfc,
                   const Tensor& dact, const Tensor& work) const {
  if (kind_ == MlpKind::GeluTanh) {
    proj.backward(be, s, dfc, dout, saved[kAct], work);
    be.gelu_backward(s, dfc, dfc, saved[kHidden]);
  } else {
    proj.backward(be, s, dact, dout, saved[kAct], work);
    be.swiglu_backward(s, dfc, dact, saved[kHidden]);
  }
  fc.backward(be, s, dinp, dfc, inp, work);
}

void Mlp::decode(Backend& be, Stream s, const Tensor& out, const Tensor& inp,
                 const Tensor& hidden, const Tensor& act) const {
  fc.forward(be, s, hidden, inp);
  activate(be, s, act, hidden);
  proj.forward(be, s, out, act);
}

void Mlp::collect(std::vector<Param*>& out) {
  fc.collect(out);
  proj.collect(out);
}

}  // namespace kiln::nn

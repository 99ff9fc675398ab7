#include "nn/norm.h"

namespace kiln::nn {

Norm::Norm(const std::string& name, int64_t C, const NormSpec& spec) : C_(C), spec_(spec) {
  KILN_CHECK(C > 0, "norm {}: width {} must be > 0", name, C);
  KILN_CHECK(!(spec.kind == NormKind::RMSNorm && spec.bias), "norm {}: RMSNorm has no bias",
             name);
  weight.name = name + ".weight";
  if (spec.weight) weight = Param(name + ".weight", Shape{C}, Init::ones(), false);
  if (spec.bias) bias = Param(name + ".bias", Shape{C}, Init::zeros(), false);
}

std::vector<SavedSpec> Norm::saved_specs(int64_t B, int64_t T, DType dtype) const {
  std::vector<SavedSpec> v{{weight.name + ":out", Shape{B, T, C_}, dtype, Recompute::WithBlock}};
  if (spec_.kind == NormKind::LayerNorm)
    v.push_back({weight.name + ":mean", Shape{B * T}, DType::F32, Recompute::WithBlock});
  v.push_back({weight.name + ":rstd", Shape{B * T}, DType::F32, Recompute::WithBlock});
  return v;
}

void Norm::forward(Backend& be, Stream s, std::span<const Tensor> saved,
                   const Tensor& inp) const {
  if (spec_.kind == NormKind::LayerNorm)
    forward_into(be, s, saved[kOut], saved[1], saved[2], inp);
  else
    forward_into(be, s, saved[kOut], Tensor(), saved[1], inp);
}

void Norm::forward_into(Backend& be, Stream s, const Tensor& out, const Tensor& mean,
                        const Tensor& rstd, const Tensor& inp) const {
  if (spec_.kind == NormKind::LayerNorm)
    be.layernorm_forward(s, out, mean, rstd, inp, opt_value(weight), opt_value(bias), spec_.eps);
  else
    be.rmsnorm_forward(s, out, rstd, inp, opt_value(weight), spec_.eps);
}

void Norm::backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dinp,
                    const Tensor& dout, const Tensor& inp) const {
  if (spec_.kind == NormKind::LayerNorm)
    backward_from(be, s, dinp, dout, inp, saved[1], saved[2]);
  else
    backward_from(be, s, dinp, dout, inp, Tensor(), saved[1]);
}

void Norm::backward_from(Backend& be, Stream s, const Tensor& dinp, const Tensor& dout,
                         const Tensor& inp, const Tensor& mean, const Tensor& rstd) const {
  if (spec_.kind == NormKind::LayerNorm)
    be.layernorm_backward(s, dinp, opt_grad(be, s, weight), opt_grad(be, s, bias), dout, inp,
                          opt_value(weight), mean, rstd);
  else
    be.rmsnorm_backward(s, dinp, opt_grad(be, s, weight), dout, inp, opt_value(weight), rstd);
}

Tensor Norm::opt_grad(Backend& be, Stream s, const Param& p) const {
  if (!p.shape.ndim()) return Tensor();
  if (p.trainable) return p.g();
  // The fused kernels write both gradients in one dtype: the trainable one's, if any.
  const Param* other = &p == &weight ? &bias : &weight;
  const DType dtype = other->shape.ndim() && other->trainable ? other->g().dtype() : DType::F32;
  Tensor scratch = be.empty(p.local_shape(), dtype, MemCategory::Temporaries);
  be.fill(s, scratch, 0.f);
  return scratch;
}

void Norm::shard(const TpPlacement& placement) {
  KILN_CHECK(placement.style == TpStyle::Sequence || placement.style == TpStyle::Replicated,
             "{}: a norm is sequence-parallel or replicated, not {}", weight.name,
             tp_style_name(placement.style));
  if (!placement.active() || !placement.sequence_parallel) return;
  weight.tp_partial_grad = spec_.weight;
  bias.tp_partial_grad = spec_.bias;
}

void Norm::collect(std::vector<Param*>& out) {
  if (spec_.weight) out.push_back(&weight);
  if (spec_.bias) out.push_back(&bias);
}

}  // namespace kiln::nn

#include "nn/linear.h"

namespace kiln::nn {

Linear::Linear(const std::string& name, int64_t in, int64_t out, bool bias, float init_std)
    : weight(name + ".weight", Shape{out, in}, Init::normal(init_std), true),
      in_(in), out_(out), has_bias_(bias) {
  if (bias) this->bias = Param(name + ".bias", Shape{out}, Init::zeros(), false);
}

void Linear::shard(const TpPlacement& placement, std::vector<int64_t> pieces) {
  KILN_CHECK(placement.style == TpStyle::Replicated || placement.style == TpStyle::Column ||
                 placement.style == TpStyle::Row,
             "{}: a Linear cannot be {}-parallel", weight.name, tp_style_name(placement.style));
  placement_ = placement;
  if (!placement.active()) return;
  const int parts = placement.group->size(), index = placement.group->rank();
  if (placement.style == TpStyle::Column) {
    weight.slice = ParamSlice{0, pieces, parts, index};
    if (has_bias_) bias.slice = ParamSlice{0, pieces, parts, index};
  } else {
    KILN_CHECK(pieces.empty(), "{}: a row-parallel Linear has no fused pieces", weight.name);
    weight.slice = ParamSlice{1, {}, parts, index};
  }
  weight.slice.check(weight.shape, weight.name);
  if (has_bias_) bias.slice.check(bias.shape, bias.name);
}

int64_t Linear::work_width() const {
  if (!placement_.active() || !placement_.sequence_parallel) return 0;
  return placement_.style == TpStyle::Column ? in_ : out_;
}

namespace {
Tensor rows_of(const Tensor& t, int64_t width) { return t.reshape(Shape{t.numel() / width, width}); }
}  // namespace

void Linear::gemm_forward(Backend& be, Stream s, const Tensor& out, const Tensor& inp,
                          const Tensor& b) const {
  if (!fp8()) return be.linear_forward(s, out, inp, weight.v(), b);
  take_amax(be, s, inp, Tensor());
  be.fp8_linear_forward(s, out, inp, weight.v(), b, fp8_.amax);
}

void Linear::take_amax(Backend& be, Stream s, const Tensor& inp, const Tensor& dout) const {
  if (!fp8()) return;
  const bool delayed = static_cast<bool>(fp8_.step_amax);
  if (delayed && !(fp8_.recording && *fp8_.recording)) return;  // evaluation: scales only
  const Tensor& a = delayed ? fp8_.step_amax : fp8_.amax;
  if (!delayed) be.fill(s, a, 0.f);
  // Delayed scaling keeps the step's max: backward adds only dout's (forward took inp's
  // and the weight's, the same tensors); tensorwise takes every operand per call.
  if (!delayed || !dout) {
    be.fp8_amax(s, a.view_at(0, Shape{1}), inp);
    be.fp8_amax(s, a.view_at(1, Shape{1}), weight.v());
  }
  if (dout) be.fp8_amax(s, a.view_at(2, Shape{1}), dout);
  if (!delayed && fp8_.group) fp8_.group->all_reduce_max(s, a);
}

void Linear::gemm_backward(Backend& be, Stream s, const Tensor& dinp, const Tensor& dw,
                           const Tensor& db, const Tensor& dout, const Tensor& inp) const {
  if (!fp8()) return be.linear_backward(s, dinp, dw, db, dout, inp, weight.v());
  be.fp8_linear_backward(s, dinp, dw, db, dout, inp, weight.v(), fp8_.amax);
}

void Linear::forward(Backend& be, Stream s, const Tensor& out, const Tensor& inp,
                     const Tensor& work) const {
  const Tensor b = has_bias_ ? bias.v() : Tensor();
  if (!placement_.active()) return gemm_forward(be, s, out, inp, b);
  TpGroup& g = *placement_.group;
  const bool sp = placement_.sequence_parallel;
  if (placement_.style == TpStyle::Column) {
    if (!sp) return gemm_forward(be, s, out, inp, b);  // copy_to_tp: identity
    const Tensor full = rows_of(work, in_);
    tp_forward(TpComm::GatherFromSp, g, be, s, full, rows_of(inp, in_));
    return gemm_forward(be, s, rows_of(out, local_out()), full, b);
  }
  // Row: partial sums, the bias on tp rank 0 only, then the reduction.
  const Tensor b0 = g.rank() == 0 ? b : Tensor();
  if (!sp) {
    gemm_forward(be, s, out, inp, b0);
    return tp_forward(TpComm::ReduceFromTp, g, be, s, out, out);
  }
  const Tensor partial = rows_of(work, out_);
  gemm_forward(be, s, partial, rows_of(inp, local_in()), b0);
  tp_forward(TpComm::ReduceScatterToSp, g, be, s, rows_of(out, out_), partial);
}

void Linear::backward(Backend& be, Stream s, const Tensor& dinp, const Tensor& dout,
                      const Tensor& inp, const Tensor& work) const {
  // A frozen weight or bias has no gradient: linear_backward skips the empty outputs.
  const Tensor dw = weight.trainable_grad();
  const Tensor db = has_bias_ ? bias.trainable_grad() : Tensor();
  if (!dinp && !dw && !db) return;  // nothing wanted (the same on every tp rank)
  if (!placement_.active()) {
    take_amax(be, s, inp, dout);
    return gemm_backward(be, s, dinp, dw, db, dout, inp);
  }
  TpGroup& g = *placement_.group;
  const bool sp = placement_.sequence_parallel;
  if (placement_.style == TpStyle::Column) {
    if (!sp) {
      take_amax(be, s, inp, dout);
      gemm_backward(be, s, dinp, dw, db, dout, inp);
      if (dinp) tp_backward(TpComm::CopyToTp, g, be, s, dinp, dinp);  // all_reduce
      return;
    }
    // Megatron re-gathers the input rather than keeping [N, in] between the passes.
    const Tensor full = rows_of(work, in_);
    const Tensor dout2 = rows_of(dout, local_out());
    tp_forward(TpComm::GatherFromSp, g, be, s, full, rows_of(inp, in_));
    take_amax(be, s, full, dout2);
    if (dw || db) gemm_backward(be, s, Tensor(), dw, db, dout2, full);
    if (!dinp) return;
    // The partial input gradient overwrites the gathered input (no longer read: with
    // dweight empty, linear_backward uses inp for its shape only).
    gemm_backward(be, s, full, Tensor(), Tensor(), dout2, full);
    return tp_backward(TpComm::GatherFromSp, g, be, s, rows_of(dinp, in_), full);  // reduce_scatter
  }
  if (!sp) {
    take_amax(be, s, inp, dout);
    return gemm_backward(be, s, dinp, dw, db, dout, inp);
  }
  const Tensor full = rows_of(work, out_);
  tp_backward(TpComm::ReduceScatterToSp, g, be, s, full, rows_of(dout, out_));  // all_gather
  const Tensor local_inp = rows_of(inp, local_in());
  take_amax(be, s, local_inp, full);
  gemm_backward(be, s, dinp ? rows_of(dinp, local_in()) : Tensor(), dw, db, full, local_inp);
}

void Linear::collect(std::vector<Param*>& out) {
  out.push_back(&weight);
  if (has_bias_) out.push_back(&bias);
}

}  // namespace kiln::nn

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

void Linear::forward(Backend& be, Stream s, const Tensor& out, const Tensor& inp,
                     const Tensor& work) const {
  const Tensor b = has_bias_ ? bias.v() : Tensor();
  if (!placement_.active()) return be.linear_forward(s, out, inp, weight.v(), b);
  TpGroup& g = *placement_.group;
  const bool sp = placement_.sequence_parallel;
  if (placement_.style == TpStyle::Column) {
    if (!sp) return be.linear_forward(s, out, inp, weight.v(), b);  // copy_to_tp: identity
    const Tensor full = rows_of(work, in_);
    tp_forward(TpComm::GatherFromSp, g, be, s, full, rows_of(inp, in_));
    return be.linear_forward(s, rows_of(out, local_out()), full, weight.v(), b);
  }
  // Row: partial sums, the bias on tp rank 0 only, then the reduction.
  const Tensor b0 = g.rank() == 0 ? b : Tensor();
  if (!sp) {
    be.linear_forward(s, out, inp, weight.v(), b0);
    return tp_forward(TpComm::ReduceFromTp, g, be, s, out, out);
  }
  const Tensor partial = rows_of(work, out_);
  be.linear_forward(s, partial, rows_of(inp, local_in()), weight.v(), b0);
  tp_forward(TpComm::ReduceScatterToSp, g, be, s, rows_of(out, out_), partial);
}

void Linear::backward(Backend& be, Stream s, const Tensor& dinp, const Tensor& dout,
                      const Tensor& inp, const Tensor& work) const {
  // A frozen weight or bias has no gradient: linear_backward skips the empty outputs.
  const Tensor dw = weight.trainable_grad();
  const Tensor db = has_bias_ ? bias.trainable_grad() : Tensor();
  if (!dinp && !dw && !db) return;  // nothing wanted (the same on every tp rank)
  if (!placement_.active()) {
    return be.linear_backward(s, dinp, dw, db, dout, inp, weight.v());
  }
  TpGroup& g = *placement_.group;
  const bool sp = placement_.sequence_parallel;
  if (placement_.style == TpStyle::Column) {
    if (!sp) {
      be.linear_backward(s, dinp, dw, db, dout, inp, weight.v());
      if (dinp) tp_backward(TpComm::CopyToTp, g, be, s, dinp, dinp);  // all_reduce
      return;
    }
    // Megatron re-gathers the input rather than keeping [N, in] between the passes.
    const Tensor full = rows_of(work, in_);
    const Tensor dout2 = rows_of(dout, local_out());
    tp_forward(TpComm::GatherFromSp, g, be, s, full, rows_of(inp, in_));
    if (dw || db) be.linear_backward(s, Tensor(), dw, db, dout2, full, weight.v());
    if (!dinp) return;
    // The partial input gradient overwrites the gathered input (no longer read: with
    // dweight empty, linear_backward uses inp for its shape only).
    be.linear_backward(s, full, Tensor(), Tensor(), dout2, full, weight.v());
    return tp_backward(TpComm::GatherFromSp, g, be, s, rows_of(dinp, in_), full);  // reduce_scatter
  }
  if (!sp) return be.linear_backward(s, dinp, dw, db, dout, inp, weight.v());
  const Tensor full = rows_of(work, out_);
  tp_backward(TpComm::ReduceScatterToSp, g, be, s, full, rows_of(dout, out_));  // all_gather
  be.linear_backward(s, dinp ? rows_of(dinp, local_in()) : Tensor(), dw, db, full,
                     rows_of(inp, local_in()), weight.v());
}

void Linear::collect(std::vector<Param*>& out) {
  out.push_back(&weight);
  if (has_bias_) out.push_back(&bias);
}

}  // namespace kiln::nn

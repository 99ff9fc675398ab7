#include "nn/expert_lora.h"

#include "core/error.h"

#include <cmath>

namespace kiln::nn {

namespace {

// A temporary [rows, cols]; zeroed when `ragged`, so that the rows a grouped GEMM leaves
// unwritten (dropped slots) hold zeros rather than whatever the memory held.
Tensor scratch(Backend& be, Stream s, int64_t rows, int64_t cols, DType dtype, bool ragged) {
  Tensor t = be.empty(Shape{rows, cols}, dtype, MemCategory::Temporaries);
  if (ragged) be.fill(s, t, 0.f);
  return t;
}

}  // namespace

ExpertLora::ExpertLora(std::string name, int64_t E, int64_t O, int64_t I,
                       std::vector<LinearPiece> pieces)
    : name_(std::move(name)), E_(E), O_(O), I_(I), pieces_(std::move(pieces)) {}

void ExpertLora::add_lora(int piece, const LoraSpec& spec) {
  LoraAdapter a = new_lora_adapter(name_, pieces_, O_, piece, spec, lora_);
  const std::string& unit = a.name;
  // PEFT's init of each expert's own module: A_e U(-1/sqrt(I), 1/sqrt(I)), B_e zero.
  a.A = Param(unit + ".lora_A.weight", Shape{E_, spec.rank, I_},
              Init::uniform(static_cast<float>(1.0 / std::sqrt(static_cast<double>(I_)))), true);
  a.B = Param(unit + ".lora_B.weight", Shape{E_, a.rows, spec.rank}, Init::zeros(), true);
  a.A.adapter = a.B.adapter = true;
  slice_adapter(a);
  lora_.push_back(std::move(a));
}

void ExpertLora::slice(const ParamSlice& weight) {
  weight_ = weight;
  for (LoraAdapter& a : lora_) slice_adapter(a);
}

void ExpertLora::slice_adapter(LoraAdapter& a) const {
  const ParamSlice& w = weight_;
  const bool column = w.tp_sharded() && w.dim == 1;  // the output rows cut (gate_up)
  const bool row = w.tp_sharded() && w.dim == 2;     // the input columns cut (down)
  // A whole piece spanning the fused output splits each piece apart, as the weight.
  std::vector<int64_t> pieces;
  if (a.piece < 0)
    for (const LinearPiece& p : pieces_) pieces.push_back(p.rows);
  a.A.slice = row ? ParamSlice{2, {}, w.parts, w.index} : ParamSlice{};
  a.B.slice = column ? ParamSlice{1, pieces, w.parts, w.index} : ParamSlice{};
  for (Param* p : {&a.A, &a.B}) {
    p->slice.ep_parts = w.ep_parts;
    p->slice.ep_index = w.ep_index;
    p->slice.check(p->shape, p->name);
  }
  a.A.tp_partial_grad = column;
  a.B.tp_partial_grad = row;
}

std::pair<int64_t, int64_t> ExpertLora::columns(const LoraAdapter& a) const {
  const int tp = output_parts();
  if (a.piece < 0) return {0, O_ / tp};
  return {a.row0 / tp, a.rows / tp};  // each piece before it splits evenly
}

void ExpertLora::forward(Backend& be, Stream s, const Tensor& out, const Tensor& inp,
                         const Tensor& offsets, bool ragged) const {
  const int64_t R = inp.size(0);
  for (const LoraAdapter& a : lora_) {
    const auto [col, width] = columns(a);
    const Tensor h = scratch(be, s, R, a.spec.rank, inp.dtype(), ragged);
    const Tensor delta = scratch(be, s, R, width, out.dtype(), ragged);
    be.grouped_linear_forward(s, h, inp, lora_weight(be, s, a.A, inp.dtype()), offsets);
    be.grouped_linear_forward(s, delta, h, lora_weight(be, s, a.B, inp.dtype()), offsets);
    be.add_columns(s, out, delta, col, a.spec.scale());  // y += scale * B_e A_e x, as PEFT
  }
}

void ExpertLora::backward(Backend& be, Stream s, const Tensor& dinp, const Tensor& dout,
                          const Tensor& inp, const Tensor& offsets, bool ragged) const {
  const int64_t R = inp.size(0);
  for (const LoraAdapter& a : lora_) {
    const int64_t r = a.spec.rank;
    const auto [col, width] = columns(a);
    const float scale = a.spec.scale();
    Tensor dpiece = dout;  // dL/d(delta) before the scale: the adapter's columns of dout
    if (width != dout.size(1)) {
      dpiece = scratch(be, s, R, width, dout.dtype(), false);
      be.copy_columns(s, dpiece, dout, 0, col, width);
    }
    // Recomputed rather than saved: h = x A_e^T [R, r].
    const Tensor h = scratch(be, s, R, r, inp.dtype(), ragged);
    const Tensor hs = scratch(be, s, R, r, inp.dtype(), false);
    const Tensor A = lora_weight(be, s, a.A, inp.dtype()), B = lora_weight(be, s, a.B, inp.dtype());
    be.grouped_linear_forward(s, h, inp, A, offsets);
    lora_scaled(be, s, hs, h, scale);
    // dB_e += dpiece^T (scale h); dh = dpiece B_e into h (its dropped rows stay zero).
    be.grouped_linear_backward(s, h, a.B.trainable_grad(), dpiece, hs, B, offsets);
    lora_scaled(be, s, hs, h, scale);
    // dA_e += (scale dh)^T x; the input gradient (scale dh) A_e.
    const Tensor dx = dinp ? scratch(be, s, R, inp.size(1), inp.dtype(), ragged) : Tensor();
    be.grouped_linear_backward(s, dx, a.A.trainable_grad(), hs, inp, A, offsets);
    if (dinp) be.add(s, dinp, dinp, dx);
  }
}

void ExpertLora::collect(std::vector<Param*>& out) {
  for (LoraAdapter& a : lora_) {
    out.push_back(&a.A);
    out.push_back(&a.B);
  }
}

}  // namespace kiln::nn

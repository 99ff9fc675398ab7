#include "nn/linear.h"

#include <cmath>
#include <tuple>

namespace kiln::nn {

Linear::Linear(const std::string& name, int64_t in, int64_t out, bool bias, float init_std,
               std::vector<LinearPiece> pieces)
    : weight(name + ".weight", Shape{out, in}, Init::normal(init_std), true),
      in_(in), out_(out), has_bias_(bias), pieces_(std::move(pieces)) {
  if (bias) this->bias = Param(name + ".bias", Shape{out}, Init::zeros(), false);
  int64_t rows = 0;
  for (const LinearPiece& p : pieces_) rows += p.rows;
  KILN_CHECK(pieces_.empty() || rows == out, "{}: its pieces' rows sum to {}, not its {} outputs",
             name, rows, out);
}

std::string Linear::name() const {
  return weight.name.substr(0, weight.name.size() - std::string(".weight").size());
}

namespace {
// The rows of each piece (ParamSlice::pieces); empty for one piece.
std::vector<int64_t> piece_rows_of(const std::vector<LinearPiece>& pieces) {
  std::vector<int64_t> rows;
  for (const LinearPiece& p : pieces) rows.push_back(p.rows);
  return rows;
}
}  // namespace

void Linear::shard(const TpPlacement& placement) {
  KILN_CHECK(placement.style == TpStyle::Replicated || placement.style == TpStyle::Column ||
                 placement.style == TpStyle::Row,
             "{}: a Linear cannot be {}-parallel", weight.name, tp_style_name(placement.style));
  placement_ = placement;
  slice_lora();
  if (!placement.active()) return;
  const int parts = placement.group->size(), index = placement.group->rank();
  const std::vector<int64_t> pieces = piece_rows_of(pieces_);
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

LoraAdapter new_lora_adapter(const std::string& host, const std::vector<LinearPiece>& pieces,
                             int64_t out, int piece, const LoraSpec& spec,
                             const std::vector<LoraAdapter>& existing) {
  KILN_CHECK(piece >= -1 && piece < static_cast<int>(pieces.size()), "{}: no piece {} (it has {})",
             host, piece, pieces.size());
  LoraAdapter a;
  a.name = piece < 0 ? host : host + "." + pieces[static_cast<size_t>(piece)].name;
  KILN_CHECK(spec.rank > 0, "{}: a LoRA adapter needs a rank > 0, not {}", a.name, spec.rank);
  for (const LoraAdapter& e : existing)
    KILN_CHECK(e.piece != piece && e.piece >= 0 && piece >= 0,
               "{}: it already has a LoRA adapter {}", a.name, e.name);
  a.piece = piece;
  a.rows = out;
  if (piece >= 0) {
    a.row0 = 0;
    for (int i = 0; i < piece; ++i) a.row0 += pieces[static_cast<size_t>(i)].rows;
    a.rows = pieces[static_cast<size_t>(piece)].rows;
  }
  a.spec = spec;
  return a;
}

void Linear::add_lora(int piece, const LoraSpec& spec) {
  LoraAdapter a = new_lora_adapter(name(), pieces_, out_, piece, spec, lora_);
  const std::string& unit = a.name;
  // PEFT's init: kaiming_uniform_(a = sqrt(5)) on A [r, in] is U(-1/sqrt(in), 1/sqrt(in)).
  a.A = Param(unit + ".lora_A.weight", Shape{spec.rank, in_},
              Init::uniform(static_cast<float>(1.0 / std::sqrt(static_cast<double>(in_)))), true);
  a.B = Param(unit + ".lora_B.weight", Shape{a.rows, spec.rank}, Init::zeros(), true);
  a.A.adapter = a.B.adapter = true;
  lora_.push_back(std::move(a));
  slice_lora();
}

void Linear::slice_lora() {
  const bool active = placement_.active();
  const int parts = active ? placement_.group->size() : 1;
  const int index = active ? placement_.group->rank() : 0;
  const bool column = active && placement_.style == TpStyle::Column;
  const bool row = active && placement_.style == TpStyle::Row;
  for (LoraAdapter& a : lora_) {
    // Column: A whole (its gradient a partial sum: each rank has its output rows), B split
    // like the output rows it adds to (each piece apart when it spans the fused output).
    // Row: A split like the input columns, B whole (its gradient partial: each rank's h
    // is a partial sum of the input columns it holds).
    const std::vector<int64_t> pieces = a.piece < 0 ? piece_rows_of(pieces_) : std::vector<int64_t>{};
    a.A.slice = row ? ParamSlice{1, {}, parts, index} : ParamSlice{};
    a.B.slice = column ? ParamSlice{0, pieces, parts, index} : ParamSlice{};
    a.A.tp_partial_grad = column;
    a.B.tp_partial_grad = row;
    a.A.slice.check(a.A.shape, a.A.name);
    a.B.slice.check(a.B.shape, a.B.name);
  }
}

bool Linear::lora_trains() const {
  for (const LoraAdapter& a : lora_)
    if (a.A.trainable || a.B.trainable) return true;
  return false;
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
  if (!placement_.active()) {
    gemm_forward(be, s, out, inp, b);
    return lora_forward(be, s, out, inp);
  }
  TpGroup& g = *placement_.group;
  const bool sp = placement_.sequence_parallel;
  if (placement_.style == TpStyle::Column) {
    if (!sp) {  // copy_to_tp: identity
      gemm_forward(be, s, out, inp, b);
      return lora_forward(be, s, out, inp);
    }
    const Tensor full = rows_of(work, in_);
    tp_forward(TpComm::GatherFromSp, g, be, s, full, rows_of(inp, in_));
    gemm_forward(be, s, rows_of(out, local_out()), full, b);
    return lora_forward(be, s, rows_of(out, local_out()), full);
  }
  // Row: partial sums, the bias on tp rank 0 only, then the reduction.
  const Tensor b0 = g.rank() == 0 ? b : Tensor();
  if (!sp) {
    gemm_forward(be, s, out, inp, b0);
    lora_forward(be, s, out, inp);
    return tp_forward(TpComm::ReduceFromTp, g, be, s, out, out);
  }
  const Tensor partial = rows_of(work, out_);
  gemm_forward(be, s, partial, rows_of(inp, local_in()), b0);
  lora_forward(be, s, partial, rows_of(inp, local_in()));
  tp_forward(TpComm::ReduceScatterToSp, g, be, s, rows_of(out, out_), partial);
}

void Linear::backward(Backend& be, Stream s, const Tensor& dinp, const Tensor& dout,
                      const Tensor& inp, const Tensor& work) const {
  // A frozen weight or bias has no gradient: linear_backward skips the empty outputs.
  const Tensor dw = weight.trainable_grad();
  const Tensor db = has_bias_ ? bias.trainable_grad() : Tensor();
  if (!dinp && !dw && !db && !lora_trains()) return;  // nothing wanted (alike on every tp rank)
  if (!placement_.active()) {
    take_amax(be, s, inp, dout);
    gemm_backward(be, s, dinp, dw, db, dout, inp);
    return lora_backward(be, s, dinp, dout, inp);
  }
  TpGroup& g = *placement_.group;
  const bool sp = placement_.sequence_parallel;
  if (placement_.style == TpStyle::Column) {
    if (!sp) {
      take_amax(be, s, inp, dout);
      gemm_backward(be, s, dinp, dw, db, dout, inp);
      lora_backward(be, s, dinp, dout, inp);
      if (dinp) tp_backward(TpComm::CopyToTp, g, be, s, dinp, dinp);  // all_reduce
      return;
    }
    // Megatron re-gathers the input rather than keeping [N, in] between the passes.
    const Tensor full = rows_of(work, in_);
    const Tensor dout2 = rows_of(dout, local_out());
    tp_forward(TpComm::GatherFromSp, g, be, s, full, rows_of(inp, in_));
    take_amax(be, s, full, dout2);
    if (dw || db) gemm_backward(be, s, Tensor(), dw, db, dout2, full);
    // The adapters read the gathered input, so their input gradient waits in a temporary.
    Tensor dlora;
    if (!lora_.empty()) {
      if (dinp) {
        dlora = be.empty(full.shape(), full.dtype(), MemCategory::Temporaries);
        be.fill(s, dlora, 0.f);
      }
      lora_backward(be, s, dlora, dout2, full);
    }
    if (!dinp) return;
    // The partial input gradient overwrites the gathered input (no longer read: with
    // dweight empty, linear_backward uses inp for its shape only).
    gemm_backward(be, s, full, Tensor(), Tensor(), dout2, full);
    if (dlora) be.add(s, full, full, dlora);
    return tp_backward(TpComm::GatherFromSp, g, be, s, rows_of(dinp, in_), full);  // reduce_scatter
  }
  if (!sp) {
    take_amax(be, s, inp, dout);
    gemm_backward(be, s, dinp, dw, db, dout, inp);
    return lora_backward(be, s, dinp, dout, inp);
  }
  const Tensor full = rows_of(work, out_);
  tp_backward(TpComm::ReduceScatterToSp, g, be, s, full, rows_of(dout, out_));  // all_gather
  const Tensor local_inp = rows_of(inp, local_in());
  take_amax(be, s, local_inp, full);
  const Tensor local_dinp = dinp ? rows_of(dinp, local_in()) : Tensor();
  gemm_backward(be, s, local_dinp, dw, db, full, local_inp);
  lora_backward(be, s, local_dinp, full, local_inp);
}

namespace {

Tensor temporary(Backend& be, const Shape& shape, DType dtype) {
  return be.empty(shape, dtype, MemCategory::Temporaries);
}

// The adapter's dropout for a pass over inputs `in` wide: element (n, c) of the pass is
// element (first_row + n) in + c of the adapter's stream.
DropoutSpec adapter_dropout(const LoraAdapter& a, int64_t in) {
  DropoutSpec d;
  if (!a.dropout || !a.dropout->on || a.spec.dropout <= 0.f) return d;
  d.p = a.spec.dropout;
  d.seed = a.dropout->seed;
  d.stream = a.dropout_stream;
  d.offset = a.dropout->first_row * static_cast<uint64_t>(in);
  return d;
}

}  // namespace

std::pair<int64_t, int64_t> Linear::lora_columns(const LoraAdapter& a) const {
  const bool column = placement_.active() && placement_.style == TpStyle::Column;
  const int64_t tp = column ? placement_.group->size() : 1;
  if (a.piece < 0) return {0, local_out()};
  return {a.row0 / tp, a.rows / tp};  // each piece before it splits evenly
}

Tensor Linear::lora_input(Backend& be, Stream s, const LoraAdapter& a, const Tensor& x) const {
  const DropoutSpec d = adapter_dropout(a, in_);
  if (!d.enabled()) return x;
  KILN_CHECK(!placement_.active() || placement_.style == TpStyle::Column,
             "{}: LoRA dropout on a row-parallel Linear is not supported", a.name);
  Tensor xd = temporary(be, x.shape(), x.dtype());
  be.dropout_forward(s, xd, x, d);
  return xd;
}

void Linear::lora_forward(Backend& be, Stream s, const Tensor& out, const Tensor& inp) const {
  for (const LoraAdapter& a : lora_) {
    const Tensor x = rows_of(inp, inp.shape()[-1]), y = rows_of(out, out.shape()[-1]);
    const int64_t N = x.shape()[0];
    const auto [col, width] = lora_columns(a);
    const Tensor h = temporary(be, Shape{N, a.spec.rank}, x.dtype());
    const Tensor delta = temporary(be, Shape{N, width}, y.dtype());
    be.linear_forward(s, h, lora_input(be, s, a, x), lora_weight(be, s, a.A, x.dtype()), Tensor());
    be.linear_forward(s, delta, h, lora_weight(be, s, a.B, x.dtype()), Tensor());
    be.add_columns(s, y, delta, col, a.spec.scale());  // y += scale * B A x, as PEFT
  }
}

void Linear::lora_backward(Backend& be, Stream s, const Tensor& dinp, const Tensor& dout,
                           const Tensor& inp) const {
  for (const LoraAdapter& a : lora_) {
    const Tensor x = rows_of(inp, inp.shape()[-1]), dy = rows_of(dout, dout.shape()[-1]);
    const int64_t N = x.shape()[0], r = a.spec.rank;
    const auto [col, width] = lora_columns(a);
    const float scale = a.spec.scale();
    Tensor dpiece = dy;  // dL/d(delta) before the scale: the adapter's columns of dout
    if (width != dy.shape()[1]) {
      dpiece = temporary(be, Shape{N, width}, dy.dtype());
      be.copy_columns(s, dpiece, dy, 0, col, width);
    }
    // Recomputed rather than saved: h = dropout(x) A^T [N, r] (one thin GEMM).
    const Tensor xd = lora_input(be, s, a, x);
    const Tensor h = temporary(be, Shape{N, r}, x.dtype()), hs = temporary(be, Shape{N, r}, x.dtype());
    const Tensor A = lora_weight(be, s, a.A, x.dtype()), B = lora_weight(be, s, a.B, x.dtype());
    be.linear_forward(s, h, xd, A, Tensor());
    lora_scaled(be, s, hs, h, scale);
    // dB += dpiece^T (scale h); dh = dpiece B, then scaled into hs (h no longer needed).
    be.linear_backward(s, h, a.B.trainable_grad(), Tensor(), dpiece, hs, B);
    lora_scaled(be, s, hs, h, scale);
    // dA += (scale dh)^T dropout(x); the input gradient (scale dh) A through the dropout.
    const Tensor dx = dinp ? temporary(be, x.shape(), x.dtype()) : Tensor();
    be.linear_backward(s, dx, a.A.trainable_grad(), Tensor(), hs, xd, A);
    if (!dinp) continue;
    const DropoutSpec d = adapter_dropout(a, in_);
    if (d.enabled()) be.dropout_backward(s, dx, dx, d);
    const Tensor di = rows_of(dinp, dinp.shape()[-1]);
    be.add(s, di, di, dx);
  }
}

void Linear::collect(std::vector<Param*>& out) {
  out.push_back(&weight);
  if (has_bias_) out.push_back(&bias);
  for (LoraAdapter& a : lora_) {
    out.push_back(&a.A);
    out.push_back(&a.B);
  }
}

}  // namespace kiln::nn

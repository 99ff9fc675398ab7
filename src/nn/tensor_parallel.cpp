#include "nn/tensor_parallel.h"

#include "core/error.h"

namespace kiln::nn {

const char* tp_comm_name(TpComm c) {
  switch (c) {
    case TpComm::CopyToTp: return "copy_to_tp";
    case TpComm::ReduceFromTp: return "reduce_from_tp";
    case TpComm::GatherFromSp: return "gather_from_sp";
    case TpComm::ReduceScatterToSp: return "reduce_scatter_to_sp";
  }
  return "?";
}

TpComm conjugate(TpComm c) {
  switch (c) {
    case TpComm::CopyToTp: return TpComm::ReduceFromTp;
    case TpComm::ReduceFromTp: return TpComm::CopyToTp;
    case TpComm::GatherFromSp: return TpComm::ReduceScatterToSp;
    case TpComm::ReduceScatterToSp: return TpComm::GatherFromSp;
  }
  return c;
}

const char* tp_style_name(TpStyle s) {
  switch (s) {
    case TpStyle::Replicated: return "replicated";
    case TpStyle::Column: return "column";
    case TpStyle::Row: return "row";
    case TpStyle::Vocab: return "vocab";
    case TpStyle::Sequence: return "sequence";
  }
  return "?";
}

void tp_forward(TpComm c, TpGroup& g, Backend& be, Stream s, const Tensor& out, const Tensor& in) {
  const int64_t n = g.size();
  const bool rows_ok = in.ndim() >= 1 && out.ndim() >= 1 && in.numel() > 0;
  switch (c) {
    case TpComm::CopyToTp:
    case TpComm::ReduceFromTp:
      KILN_CHECK(out.numel() == in.numel() && out.dtype() == in.dtype(),
                 "{}: out {} and in {} must match", tp_comm_name(c), out.str(), in.str());
      if (out.raw() != in.raw()) be.copy(s, out, in);
      if (c == TpComm::ReduceFromTp) g.all_reduce_sum(s, out);
      return;
    case TpComm::GatherFromSp:
      KILN_CHECK(rows_ok && out.numel() == n * in.numel() && out.dtype() == in.dtype(),
                 "{}: out {} must hold {} times the rows of in {}", tp_comm_name(c), out.str(), n,
                 in.str());
      g.all_gather_rows(s, out, in);
      return;
    case TpComm::ReduceScatterToSp:
      KILN_CHECK(rows_ok && in.numel() == n * out.numel() && out.dtype() == in.dtype(),
                 "{}: in {} must hold {} times the rows of out {}", tp_comm_name(c), in.str(), n,
                 out.str());
      g.reduce_scatter_rows(s, out, in);
      return;
  }
}

void tp_backward(TpComm c, TpGroup& g, Backend& be, Stream s, const Tensor& din,
                 const Tensor& dout) {
  tp_forward(conjugate(c), g, be, s, din, dout);
}

bool column_row_split(const TpPlacement& first, const TpPlacement& second,
                      const std::string& layer) {
  const bool split = first.style == TpStyle::Column && second.style == TpStyle::Row;
  KILN_CHECK(split || (first.style == TpStyle::Replicated && second.style == TpStyle::Replicated),
             "{}: a pair of Linears is split (column then row) or replicated, not {} then {}",
             layer, tp_style_name(first.style), tp_style_name(second.style));
  return split && first.active() && second.active();
}

DropoutSpec rows_dropout(DropoutSpec d, const TpPlacement& placement, int64_t local_numel) {
  if (placement.active() && placement.sequence_parallel)
    d.offset += static_cast<uint64_t>(placement.group->rank()) * static_cast<uint64_t>(local_numel);
  return d;
}

}  // namespace kiln::nn

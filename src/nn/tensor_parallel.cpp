#include "nn/tensor_parallel.h"

#include "core/error.h"

#include <algorithm>
#include <numeric>

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

void TpSlice::check(const Shape& global, const std::string& what) const {
  KILN_CHECK(parts >= 1 && 0 <= index && index < parts, "{}: tp slice {} of {} is out of range",
             what, index, parts);
  if (parts == 1) return;
  KILN_CHECK(0 <= dim && dim < global.ndim(), "{}: cannot split dimension {} of {}", what, dim,
             global.str());
  const int64_t total = global[dim];
  const std::vector<int64_t> p = pieces.empty() ? std::vector<int64_t>{total} : pieces;
  KILN_CHECK(std::accumulate(p.begin(), p.end(), int64_t{0}) == total,
             "{}: pieces of dimension {} do not sum to {}", what, dim, total);
  for (int64_t piece : p) {
    KILN_CHECK(piece % parts == 0,
               "{}: dimension {} of {} (a piece of {}) does not divide over tp = {}", what, dim,
               global.str(), piece, parts);
  }
}

Shape TpSlice::local_shape(const Shape& global) const {
  if (parts == 1) return global;
  Shape local;
  for (int i = 0; i < global.ndim(); ++i) local.push_back(i == dim ? global[i] / parts : global[i]);
  return local;
}

std::vector<std::pair<int64_t, int64_t>> TpSlice::ranges(const Shape& global) const {
  if (parts == 1) return {{0, global.ndim() ? global[dim] : 1}};
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t start = 0;
  const std::vector<int64_t> p = pieces.empty() ? std::vector<int64_t>{global[dim]} : pieces;
  for (int64_t piece : p) {
    const int64_t len = piece / parts;
    out.emplace_back(start + index * len, start + (index + 1) * len);
    start += piece;
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> TpSlice::global_runs(const Shape& global) const {
  if (parts == 1) return {{0, global.numel()}};
  // outer: elements of the dims before `dim`; inner: of the dims after it.
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= global[i];
  for (int i = dim + 1; i < global.ndim(); ++i) inner *= global[i];
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t o = 0; o < outer; ++o) {
    for (const auto& [b, e] : ranges(global)) {
      const int64_t from = (o * global[dim] + b) * inner, to = (o * global[dim] + e) * inner;
      if (!runs.empty() && runs.back().second == from) {
        runs.back().second = to;
      } else {
        runs.emplace_back(from, to);
      }
    }
  }
  return runs;
}

std::vector<TpSlice::Run> TpSlice::global_runs(const Shape& global, int64_t local_begin,
                                              int64_t local_end) const {
  KILN_CHECK(0 <= local_begin && local_begin <= local_end &&
                 local_end <= local_shape(global).numel(),
             "local range [{}, {}) outside a tp slice of {} elements", local_begin, local_end,
             local_shape(global).numel());
  std::vector<Run> out;
  int64_t at = 0;  // local index of the current run's first element
  for (const auto& [b, e] : global_runs(global)) {
    const int64_t lo = std::max(local_begin, at), hi = std::min(local_end, at + (e - b));
    if (lo < hi) out.push_back({b + (lo - at), b + (hi - at), lo});
    at += e - b;
    if (at >= local_end) break;
  }
  return out;
}

std::vector<int64_t> TpSlice::global_indices(const Shape& global) const {
  std::vector<int64_t> idx;
  idx.reserve(static_cast<size_t>(local_shape(global).numel()));
  for (const auto& [b, e] : global_runs(global))
    for (int64_t i = b; i < e; ++i) idx.push_back(i);
  return idx;
}

}  // namespace kiln::nn

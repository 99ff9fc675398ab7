#include "nn/param_slice.h"

#include "core/error.h"

#include <algorithm>
#include <numeric>

namespace kiln::nn {

void ParamSlice::check(const Shape& global, const std::string& what) const {
  KILN_CHECK(parts >= 1 && 0 <= index && index < parts, "{}: tp slice {} of {} is out of range",
             what, index, parts);
  KILN_CHECK(ep_parts >= 1 && 0 <= ep_index && ep_index < ep_parts,
             "{}: ep slice {} of {} is out of range", what, ep_index, ep_parts);
  if (ep_parts > 1) {
    KILN_CHECK(global.ndim() >= 1 && global[0] % ep_parts == 0,
               "{}: the {} experts of {} do not divide over ep = {}", what,
               global.ndim() ? global[0] : 0, global.str(), ep_parts);
    KILN_CHECK(parts == 1 || dim > 0, "{}: the tp and ep cuts are both on dimension 0", what);
  }
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

Shape ParamSlice::expert_block(const Shape& global) const {
  if (ep_parts == 1) return global;
  Shape block;
  for (int i = 0; i < global.ndim(); ++i) block.push_back(i == 0 ? global[i] / ep_parts : global[i]);
  return block;
}

Shape ParamSlice::local_shape(const Shape& global) const {
  const Shape block = expert_block(global);
  if (parts == 1) return block;
  Shape local;
  for (int i = 0; i < block.ndim(); ++i) local.push_back(i == dim ? block[i] / parts : block[i]);
  return local;
}

std::vector<std::pair<int64_t, int64_t>> ParamSlice::ranges(const Shape& global) const {
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

std::vector<std::pair<int64_t, int64_t>> ParamSlice::global_runs(const Shape& global) const {
  // The rank's experts are one contiguous block of the global tensor, starting at
  // element `shift`; the tp cut's runs within the block are shifted there.
  const Shape block = expert_block(global);
  const int64_t shift = static_cast<int64_t>(ep_index) * block.numel() * (ep_parts > 1 ? 1 : 0);
  if (parts == 1) return {{shift, shift + block.numel()}};
  // outer: elements of the dims before `dim`; inner: of the dims after it.
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= block[i];
  for (int i = dim + 1; i < block.ndim(); ++i) inner *= block[i];
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t o = 0; o < outer; ++o) {
    for (const auto& [b, e] : ranges(block)) {
      const int64_t from = shift + (o * block[dim] + b) * inner;
      const int64_t to = shift + (o * block[dim] + e) * inner;
      if (!runs.empty() && runs.back().second == from) {
        runs.back().second = to;
      } else {
        runs.emplace_back(from, to);
      }
    }
  }
  return runs;
}

std::vector<ParamSlice::Run> ParamSlice::global_runs(const Shape& global, int64_t local_begin,
                                                     int64_t local_end) const {
  KILN_CHECK(0 <= local_begin && local_begin <= local_end &&
                 local_end <= local_shape(global).numel(),
             "local range [{}, {}) outside a parameter slice of {} elements", local_begin,
             local_end, local_shape(global).numel());
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

std::vector<int64_t> ParamSlice::global_indices(const Shape& global) const {
  std::vector<int64_t> idx;
  idx.reserve(static_cast<size_t>(local_shape(global).numel()));
  for (const auto& [b, e] : global_runs(global))
    for (int64_t i = b; i < e; ++i) idx.push_back(i);
  return idx;
}

}  // namespace kiln::nn

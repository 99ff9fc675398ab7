#include "nn/expert_parallel.h"

#include "core/error.h"

#include <climits>
#include <numeric>

namespace kiln::nn {

EpDispatch make_ep_dispatch(std::span<const int32_t> own, std::span<const int32_t> incoming,
                            int ep, int rank) {
  const auto E = static_cast<int64_t>(own.size());
  KILN_CHECK(ep >= 1 && rank >= 0 && rank < ep && E > 0 && E % ep == 0,
             "expert parallel: {} experts over ep = {} (rank {}): ep must divide the experts",
             E, ep, rank);
  EpDispatch d;
  d.ep = ep;
  d.rank = rank;
  d.local_experts = E / ep;
  const int64_t El = d.local_experts;
  KILN_CHECK(static_cast<int64_t>(incoming.size()) == ep * El,
             "expert parallel: {} incoming counts, expected ep ({}) x local experts ({})",
             incoming.size(), ep, El);
  for (std::span<const int32_t> counts : {own, incoming})
    for (int32_t c : counts) KILN_CHECK(c >= 0, "expert parallel: negative slot count {}", c);
  const auto at = [](std::span<const int32_t> v, int64_t i) {
    return static_cast<int64_t>(v[static_cast<size_t>(i)]);
  };
  for (int q = 0; q < ep; ++q) {
    int64_t sent = 0, got = 0;
    for (int64_t j = 0; j < El; ++j) {
      sent += at(own, q * El + j);
      got += at(incoming, q * El + j);
    }
    d.send_rows.push_back(sent);
    d.recv_rows.push_back(got);
  }
  // By expert: local expert j's rows from source 0, then source 1, ...
  int64_t total = 0;
  d.offsets.push_back(0);
  for (int64_t j = 0; j < El; ++j) {
    for (int s = 0; s < ep; ++s) total += at(incoming, s * El + j);
    KILN_CHECK(total <= INT32_MAX, "expert parallel: {} rows received exceed int32", total);
    d.offsets.push_back(static_cast<int32_t>(total));
  }
  // Received rows come by source, then local expert: walk them in that order.
  std::vector<int64_t> next(d.offsets.begin(), d.offsets.end() - 1);  // per local expert
  d.to_expert_order.reserve(static_cast<size_t>(d.received()));
  for (int s = 0; s < ep; ++s)
    for (int64_t j = 0; j < El; ++j)
      for (int64_t i = 0; i < at(incoming, s * El + j); ++i)
        d.to_expert_order.push_back(static_cast<int32_t>(next[static_cast<size_t>(j)]++));
  return d;
}

void EpGroup::exchange_counts(Backend& be, Stream s, std::span<const int32_t> own,
                              std::span<int32_t> incoming) {
  // Rank q's El counts go to rank q: an all-to-all of one row of El int32 per rank.
  const int ep = size();
  const auto El = static_cast<int64_t>(own.size()) / ep;
  KILN_CHECK(El * ep == static_cast<int64_t>(own.size()) && incoming.size() == own.size(),
             "expert parallel: {} counts out and {} in over ep = {}", own.size(),
             incoming.size(), ep);
  const Tensor send = be.empty(Shape{ep, El}, DType::I32, MemCategory::Temporaries);
  const Tensor recv = be.empty(Shape{ep, El}, DType::I32, MemCategory::Temporaries);
  be.copy_from_host(s, send, own.data());
  const std::vector<int64_t> one(static_cast<size_t>(ep), 1);
  all_to_all_rows(s, recv, send, one, one);
  be.copy_to_host(s, incoming.data(), recv);
}

EpExchange ep_exchange(Backend& be, Stream s, EpGroup& group, const Tensor& offsets,
                       MemCategory category) {
  const int ep = group.size();
  const int64_t E = offsets.numel() - 1;
  KILN_CHECK(E > 0 && E % ep == 0, "expert parallel: {} experts do not divide over ep = {}", E,
             ep);
  std::vector<int32_t> bounds(static_cast<size_t>(E + 1));
  be.copy_to_host(s, bounds.data(), offsets);
  std::vector<int32_t> own(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    own[static_cast<size_t>(e)] = bounds[static_cast<size_t>(e + 1)] - bounds[static_cast<size_t>(e)];
  std::vector<int32_t> incoming(static_cast<size_t>(E));
  group.exchange_counts(be, s, own, incoming);
  EpExchange x;
  x.plan = make_ep_dispatch(own, incoming, ep, group.rank());
  const int64_t R = x.plan.received();
  x.order = be.empty(Shape{R, 1}, DType::I32, category);
  x.offsets = be.empty(Shape{E / ep + 1}, DType::I32, category);
  if (R > 0) be.copy_from_host(s, x.order, x.plan.to_expert_order.data());
  be.copy_from_host(s, x.offsets, x.plan.offsets.data());
  return x;
}

namespace {
/// t's first `rows` rows.
Tensor first_rows(const Tensor& t, int64_t rows) {
  Shape s{rows};
  for (int i = 1; i < t.ndim(); ++i) s.push_back(t.size(i));
  return t.view_at(0, s);
}

int64_t total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }
}  // namespace

void ep_dispatch(Backend& be, Stream s, EpGroup& group, const EpExchange& x, const Tensor& out,
                 const Tensor& in) {
  const int64_t R = x.plan.received();
  KILN_CHECK(out.size(0) == R && in.size(0) >= total(x.plan.send_rows),
             "expert parallel: dispatch of {} rows into {}, {} received", in.str(), out.str(), R);
  const Tensor arrived = be.empty(out.shape(), out.dtype(), MemCategory::Temporaries);
  group.all_to_all_rows(s, arrived, in, x.plan.send_rows, x.plan.recv_rows);
  if (R > 0) be.moe_permute(s, out, arrived, x.order);  // out[order[i]] = arrived[i]
}

void ep_combine(Backend& be, Stream s, EpGroup& group, const EpExchange& x, const Tensor& out,
                const Tensor& in) {
  const int64_t R = x.plan.received();
  KILN_CHECK(in.size(0) == R && out.size(0) >= total(x.plan.send_rows),
             "expert parallel: combine of {} rows into {}, {} sent", in.str(), out.str(),
             total(x.plan.send_rows));
  const Tensor by_source = be.empty(in.shape(), in.dtype(), MemCategory::Temporaries);
  if (R > 0) be.moe_permute_backward(s, by_source, in, x.order);  // by_source[i] = in[order[i]]
  group.all_to_all_rows(s, first_rows(out, total(x.plan.send_rows)), by_source,
                        x.plan.recv_rows, x.plan.send_rows);
}

}  // namespace kiln::nn

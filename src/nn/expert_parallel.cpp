#include "nn/expert_parallel.h"

#include "core/error.h"

#include <algorithm>
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
  all_to_all_rows(s, recv, send, one, one)->wait();
  be.copy_to_host(s, incoming.data(), recv);
}

int64_t EpExchange::received() const {
  int64_t r = 0;
  for (const EpChunk& c : chunks) r += c.plan.received();
  return r;
}

std::vector<int32_t> ep_first_chunk(std::span<const int32_t> counts, int64_t El) {
  std::vector<int32_t> first(counts.size(), 0);
  for (size_t run = 0; run < counts.size(); run += static_cast<size_t>(El)) {
    int64_t n = 0;
    for (int64_t j = 0; j < El; ++j) n += counts[run + static_cast<size_t>(j)];
    int64_t left = (n + 1) / 2;
    for (int64_t j = 0; j < El; ++j) {
      const auto i = run + static_cast<size_t>(j);
      first[i] = static_cast<int32_t>(std::min<int64_t>(counts[i], left));
      left -= first[i];
    }
  }
  return first;
}

namespace {
int64_t total(std::span<const int64_t> v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

/// to_chunk_order for a sender whose counts per global expert are `own` and chunk 0's
/// `first` (ep runs of El): the rows for rank q are consecutive in expert order, the
/// first of them (first's run) chunk 0's.
std::vector<int32_t> chunk_order(std::span<const int32_t> own, std::span<const int32_t> first,
                                 int ep, int64_t El) {
  std::vector<int64_t> n(static_cast<size_t>(ep), 0), h(static_cast<size_t>(ep), 0);
  for (int q = 0; q < ep; ++q)
    for (int64_t j = 0; j < El; ++j) {
      n[static_cast<size_t>(q)] += own[static_cast<size_t>(q * El + j)];
      h[static_cast<size_t>(q)] += first[static_cast<size_t>(q * El + j)];
    }
  const int64_t chunk0 = std::accumulate(h.begin(), h.end(), int64_t{0});
  std::vector<int32_t> out;
  int64_t at0 = 0, at1 = chunk0;
  for (int q = 0; q < ep; ++q) {
    const auto i = static_cast<size_t>(q);
    for (int64_t r = 0; r < n[i]; ++r)
      out.push_back(static_cast<int32_t>(r < h[i] ? at0++ : at1++));
  }
  return out;
}
}  // namespace

EpExchange ep_exchange(Backend& be, Stream s, EpGroup& group, const Tensor& offsets,
                       MemCategory category) {
  const int ep = group.size();
  const int64_t E = offsets.numel() - 1;
  KILN_CHECK(E > 0 && E % ep == 0, "expert parallel: {} experts do not divide over ep = {}", E,
             ep);
  const int64_t El = E / ep;
  std::vector<int32_t> bounds(static_cast<size_t>(E + 1));
  be.copy_to_host(s, bounds.data(), offsets);
  std::vector<int32_t> own(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    own[static_cast<size_t>(e)] = bounds[static_cast<size_t>(e + 1)] - bounds[static_cast<size_t>(e)];
  std::vector<int32_t> incoming(static_cast<size_t>(E));
  group.exchange_counts(be, s, own, incoming);
  // Chunk 0 takes the first half of each rank's rows for each rank; chunk 1 the rest.
  const std::vector<int32_t> own0 = ep_first_chunk(own, El), in0 = ep_first_chunk(incoming, El);
  std::vector<int32_t> own1(own.size()), in1(incoming.size());
  for (size_t i = 0; i < own.size(); ++i) {
    own1[i] = own[i] - own0[i];
    in1[i] = incoming[i] - in0[i];
  }
  EpExchange x;
  x.to_chunk_order = chunk_order(own, own0, ep, El);
  int64_t begin = 0;
  for (int c = 0; c < kEpChunks; ++c) {
    EpChunk& ch = x.chunks[static_cast<size_t>(c)];
    ch.plan = make_ep_dispatch(c == 0 ? own0 : own1, c == 0 ? in0 : in1, ep, group.rank());
    const int64_t R = ch.plan.received();
    ch.order = be.empty(Shape{R, 1}, DType::I32, category);
    ch.offsets = be.empty(Shape{El + 1}, DType::I32, category);
    if (R > 0) be.copy_from_host(s, ch.order, ch.plan.to_expert_order.data());
    be.copy_from_host(s, ch.offsets, ch.plan.offsets.data());
    ch.send_begin = begin;
    ch.sent = total(ch.plan.send_rows);
    begin += ch.sent;
  }
  return x;
}

void ep_chunk_rows(Backend& be, Stream s, const EpExchange& x, const Tensor& rows) {
  // Nothing kept: every row is -1 already (so too under the planner, whose meta backend
  // leaves the counts zero and holds no rows to read).
  if (x.to_chunk_order.empty()) return;
  std::vector<int32_t> r(static_cast<size_t>(rows.numel()));
  be.copy_to_host(s, r.data(), rows);
  for (int32_t& v : r) {
    if (v < 0) continue;  // dropped
    KILN_CHECK(static_cast<size_t>(v) < x.to_chunk_order.size(),
               "expert parallel: slot row {} outside the {} kept", v, x.to_chunk_order.size());
    v = x.to_chunk_order[static_cast<size_t>(v)];
  }
  be.copy_from_host(s, rows, r.data());
}

EpTransfer ep_dispatch_start(Backend& be, Stream s, EpGroup& group, const EpExchange& x, int c,
                             const Tensor& in) {
  const EpChunk& ch = x.chunks[static_cast<size_t>(c)];
  KILN_CHECK(in.size(0) >= ch.send_begin + ch.sent, "expert parallel: dispatch of chunk {} "
             "(rows [{}, {})) from {}", c, ch.send_begin, ch.send_begin + ch.sent, in.str());
  Shape by_source{ch.plan.received()};
  for (int i = 1; i < in.ndim(); ++i) by_source.push_back(in.size(i));
  EpTransfer t;
  t.buffer = be.empty(by_source, in.dtype(), MemCategory::Temporaries);
  t.transfer = group.all_to_all_rows(s, t.buffer, in.slice_rows(ch.send_begin, ch.send_begin + ch.sent),
                                     ch.plan.send_rows, ch.plan.recv_rows);
  return t;
}

void ep_dispatch_finish(Backend& be, Stream s, const EpExchange& x, int c, EpTransfer& t,
                        const Tensor& out) {
  const EpChunk& ch = x.chunks[static_cast<size_t>(c)];
  KILN_CHECK(out.size(0) == ch.plan.received(), "expert parallel: chunk {} received {} rows, "
             "not {}'s", c, ch.plan.received(), out.str());
  t.transfer->wait();
  if (out.size(0) > 0) be.moe_permute(s, out, t.buffer, ch.order);  // out[order[i]] = arrived[i]
  t.buffer = Tensor();
}

EpTransfer ep_combine_start(Backend& be, Stream s, EpGroup& group, const EpExchange& x, int c,
                            const Tensor& out, const Tensor& in) {
  const EpChunk& ch = x.chunks[static_cast<size_t>(c)];
  const int64_t R = ch.plan.received();
  KILN_CHECK(in.size(0) == R && out.size(0) >= ch.send_begin + ch.sent,
             "expert parallel: combine of chunk {} ({} rows) from {} into {}", c, R, in.str(),
             out.str());
  EpTransfer t;
  t.buffer = be.empty(in.shape(), in.dtype(), MemCategory::Temporaries);
  if (R > 0) be.moe_permute_backward(s, t.buffer, in, ch.order);  // by source: in[order[i]]
  t.transfer = group.all_to_all_rows(s, out.slice_rows(ch.send_begin, ch.send_begin + ch.sent), t.buffer,
                                     ch.plan.recv_rows, ch.plan.send_rows);
  return t;
}

}  // namespace kiln::nn

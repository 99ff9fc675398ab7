#include "nn/expert_parallel.h"

#include "core/error.h"

#include <climits>

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

}  // namespace kiln::nn

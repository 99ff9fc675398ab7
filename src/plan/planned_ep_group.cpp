#include "plan/planned_ep_group.h"

#include "core/error.h"

#include <algorithm>

namespace kiln::plan {

PlannedEpGroup::PlannedEpGroup(Communicator& comm, MoeRouting routing, int64_t tokens, int k,
                               int64_t experts)
    : comm_(comm), routing_(routing), tokens_(tokens), k_(k), experts_(experts) {
  KILN_CHECK(experts > 0 && experts % comm.size() == 0 && k >= 1 && k <= experts,
             "memplan: {} experts (top {}) over ep = {}", experts, k, comm.size());
}

namespace {
class Done final : public nn::EpGroup::Transfer {
 public:
  void wait() override {}
};
}  // namespace

std::unique_ptr<nn::EpGroup::Transfer> PlannedEpGroup::all_to_all_rows(
    Stream, const Tensor&, const Tensor&, std::span<const int64_t>, std::span<const int64_t>) {
  return std::make_unique<Done>();
}

void PlannedEpGroup::exchange_counts(Backend&, Stream, std::span<const int32_t>,
                                     std::span<int32_t> incoming) {
  const int ep = size();
  const int64_t El = experts_ / ep;
  std::fill(incoming.begin(), incoming.end(), 0);
  for (int s = 0; s < ep; ++s) {
    int32_t* row = incoming.data() + s * El;
    if (routing_ == MoeRouting::Worst) {  // all to this rank's first expert
      row[0] = static_cast<int32_t>(tokens_ * std::min(k_, El));
      continue;
    }
    // N k / E slots per expert, the remainder of the source's N k / ep spread from the first.
    const int64_t slots = tokens_ * k_;
    for (int64_t j = 0; j < El; ++j) {
      const int64_t e = rank() * El + j;
      row[j] = static_cast<int32_t>(slots / experts_ + (e < slots % experts_ ? 1 : 0));
    }
  }
}

}  // namespace kiln::plan

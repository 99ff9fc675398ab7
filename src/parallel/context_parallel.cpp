#include "parallel/context_parallel.h"

#include "comm/ledger.h"
#include "core/error.h"
#include "models/registry.h"
#include "nn/block.h"

#include <fmt/format.h>

#include <cstring>

namespace kiln {

namespace {
class CommTransfer final : public nn::CpGroup::Transfer {
 public:
  CommTransfer(std::shared_ptr<Work> send, std::shared_ptr<Work> recv)
      : send_(std::move(send)), recv_(std::move(recv)) {}
  void wait() override {
    send_->wait();
    recv_->wait();
  }

 private:
  std::shared_ptr<Work> send_, recv_;
};
}  // namespace

std::unique_ptr<nn::CpGroup::Transfer> CommCpGroup::shift(Stream s, const Tensor& send,
                                                          const Tensor& recv, int tag) {
  KILN_CHECK(send.shape() == recv.shape() && send.dtype() == recv.dtype(),
             "ring shift: send {} and receive {} buffers differ", send.str(), recv.str());
  const int n = comm_.size(), r = comm_.rank();
  const CommSite site("cp.ring shift tag {}", tag);
  comm_.group_start();
  auto sw = comm_.send_async(send, (r + 1) % n, tag, s);
  auto rw = comm_.recv_async(recv, (r + n - 1) % n, tag, s);
  comm_.group_end();
  return std::make_unique<CommTransfer>(std::move(sw), std::move(rw));
}

void ContextParallelPlan::apply(const LayerRoles& layers) const {
  if (group_.size() == 1) return;
  KILN_CHECK(model_arch(layers.arch).context_parallel, "{} is not supported for {} (its "
             "registry entry, ModelArch::context_parallel)", what(), layers.arch);
  KILN_CHECK(layers.tables.cp, "{} is not supported for {}: it states no context-parallel plan "
             "table (models/layer_plan.h)", what(), layers.arch);
  if (!layers.tables.cp->attention) return;
  for (nn::TransformerBlock* b : layers.blocks) b->set_context_parallel(group_);
}

std::string ContextParallelPlan::what() const {
  return fmt::format("context parallelism (parallel.cp = {})", group_.size());
}

void cp_split_rows(std::byte* local, const std::byte* full, int64_t B, int64_t T,
                   int64_t token_bytes, std::span<const int32_t> positions) {
  const auto P = static_cast<int64_t>(positions.size());
  const auto n = static_cast<size_t>(token_bytes);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < P; ++t)
      std::memcpy(local + (b * P + t) * token_bytes,
                  full + (b * T + positions[static_cast<size_t>(t)]) * token_bytes, n);
}

}  // namespace kiln

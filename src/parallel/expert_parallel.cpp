#include "parallel/expert_parallel.h"

#include "comm/ledger.h"
#include "core/error.h"
#include "nn/block.h"

#include <fmt/format.h>

#include <chrono>
#include <vector>

namespace kiln {

namespace {
/// Elements per row of t [rows, W...]: the product of W.
int64_t row_width(const Tensor& t) {
  int64_t w = 1;
  for (int i = 1; i < t.shape().ndim(); ++i) w *= t.size(i);
  return w;
}

class CommTransfer final : public nn::EpGroup::Transfer {
 public:
  /// wait() adds the seconds it blocked to `wait_seconds`.
  CommTransfer(std::shared_ptr<Work> work, double& wait_seconds)
      : work_(std::move(work)), wait_seconds_(wait_seconds) {}
  void wait() override {
    const auto t0 = std::chrono::steady_clock::now();
    work_->wait();
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  std::shared_ptr<Work> work_;
  double& wait_seconds_;
};
}  // namespace

std::unique_ptr<nn::EpGroup::Transfer> CommEpGroup::all_to_all_rows(
    Stream s, const Tensor& out, const Tensor& in, std::span<const int64_t> send_rows,
    std::span<const int64_t> recv_rows) {
  const int64_t w = row_width(in);
  KILN_CHECK(out.dtype() == in.dtype() && row_width(out) == w,
             "expert parallel: all_to_all rows of {} into {}", in.str(), out.str());
  std::vector<int64_t> send(send_rows.begin(), send_rows.end());
  std::vector<int64_t> recv(recv_rows.begin(), recv_rows.end());
  for (int64_t& c : send) c *= w;
  for (int64_t& c : recv) c *= w;
  const CommSite site("ep.all_to_all tokens");
  return std::make_unique<CommTransfer>(comm_.all_to_all_async(out, in, send, recv, s),
                                        wait_seconds_);
}

double CommEpGroup::take_wait_seconds() {
  const double w = wait_seconds_;
  wait_seconds_ = 0.0;
  return w;
}

void ExpertParallelPlan::apply(const LayerRoles& layers) const {
  if (group_.size() == 1) return;
  bool any = false;
  for (nn::TransformerBlock* b : layers.blocks) {
    if (nn::MoeMlp* moe = b->moe()) {
      moe->set_expert_parallel(group_);
      any = true;
    }
  }
  KILN_CHECK(any, "{} needs a mixture-of-experts model: {} has no MoE block (model.moe."
             "num_experts)", what(), layers.arch);
}

EpTraffic ep_update_traffic(int64_t moe_layers, int64_t micro_batches, int64_t tokens, int top_k,
                            int64_t experts, int64_t n_embd, int64_t act_bytes,
                            bool full_recompute) {
  const int64_t rows = 2 * tokens * top_k * n_embd * act_bytes;  // there and back
  const int64_t forwards = full_recompute ? 2 : 1;
  EpTraffic t;
  // Forward: the counts, then each chunk there and back; backward: each chunk there and back.
  t.calls = moe_layers * micro_batches * ((1 + 2 * nn::kEpChunks) * forwards + 2 * nn::kEpChunks);
  t.bytes = moe_layers * micro_batches * (forwards * (experts * 4 + rows) + rows);
  return t;
}

std::string ExpertParallelPlan::what() const {
  return fmt::format("expert parallelism (parallel.ep = {})", group_.size());
}

}  // namespace kiln

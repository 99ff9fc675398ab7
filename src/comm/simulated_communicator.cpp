#include "comm/simulated_communicator.h"

#include "comm/detail.h"

#include <atomic>

namespace kiln {

namespace {

// Complete after `polls` calls of is_completed(), or when it or any later operation of
// the same communicator is waited for (operations complete in submission order).
class PolledWork final : public Work {
 public:
  PolledWork(std::string description, int polls, int64_t seq,
             std::shared_ptr<std::atomic<int64_t>> waited)
      : description_(std::move(description)), left_(polls), seq_(seq), waited_(std::move(waited)) {}
  void wait() override {
    left_.store(0);
    int64_t w = waited_->load();
    while (w < seq_ && !waited_->compare_exchange_weak(w, seq_)) {
    }
  }
  bool is_completed() const override {
    if (left_.load() <= 0 || waited_->load() >= seq_) return true;
    left_.fetch_sub(1);
    return false;
  }
  std::string description() const override { return description_; }

 private:
  std::string description_;
  mutable std::atomic<int> left_;
  int64_t seq_;
  std::shared_ptr<std::atomic<int64_t>> waited_;
};

}  // namespace

SimulatedCommunicator::SimulatedCommunicator(int size, int rank, std::string name, int completion_polls)
    : InProcessCommunicator(std::move(name)), size_(size), rank_(rank), polls_(completion_polls) {
  KILN_CHECK(size >= 1 && rank >= 0 && rank < size,
             "SimulatedCommunicator: rank {} of {} is not a rank of the world", rank, size);
  KILN_CHECK(completion_polls >= 0, "SimulatedCommunicator: completion_polls must be >= 0");
}

std::shared_ptr<Work> SimulatedCommunicator::issue(const CheckedCall& call, Stream) {
  calls_.push_back({call.kind, call.bytes, phase_});
  if (polls_ == 0) return comm_detail::completed_work(call.description);
  return std::make_shared<PolledWork>(call.description, polls_, ++issued_, waited_);
}

std::unique_ptr<Communicator> SimulatedCommunicator::make_group(const std::vector<int>& ranks,
                                                                const std::string& name) {
  int mine = 0;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == rank_) mine = static_cast<int>(i);
  return std::make_unique<SimulatedCommunicator>(static_cast<int>(ranks.size()), mine, name, polls_);
}

std::unique_ptr<Communicator> SimulatedCommunicator::make_split(int, int, const std::string& name) {
  return std::make_unique<SimulatedCommunicator>(1, 0, name, polls_);
}

}  // namespace kiln

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

using comm_detail::describe;

SimulatedCommunicator::SimulatedCommunicator(int size, int rank, std::string name, int completion_polls)
    : Communicator(std::move(name)), size_(size), rank_(rank), polls_(completion_polls) {
  KILN_CHECK(size >= 1 && rank >= 0 && rank < size,
             "SimulatedCommunicator: rank {} of {} is not a rank of the world", rank, size);
  KILN_CHECK(completion_polls >= 0, "SimulatedCommunicator: completion_polls must be >= 0");
}

std::shared_ptr<Work> SimulatedCommunicator::finish(Collective c, int64_t bytes,
                                                    std::string description) {
  record(c, bytes, 0.0);
  calls_.push_back({c, bytes, phase_});
  if (polls_ == 0) return comm_detail::completed_work(std::move(description));
  return std::make_shared<PolledWork>(std::move(description), polls_, ++issued_, waited_);
}

std::shared_ptr<Work> SimulatedCommunicator::all_reduce_async(const Tensor& t, ReduceOp op, Stream) {
  check_buffer(t, "all_reduce");
  return finish(Collective::AllReduce, static_cast<int64_t>(t.nbytes()),
                describe(Collective::AllReduce, t, reduce_op_name(op)));
}

std::shared_ptr<Work> SimulatedCommunicator::reduce_scatter_async(const Tensor& output,
                                                                  const Tensor& input, Stream) {
  check_reduce_scatter(output, input);
  return finish(Collective::ReduceScatter, static_cast<int64_t>(input.nbytes()),
                describe(Collective::ReduceScatter, input));
}

std::shared_ptr<Work> SimulatedCommunicator::all_gather_async(const Tensor& output,
                                                              const Tensor& input, Stream) {
  check_all_gather(output, input);
  return finish(Collective::AllGather, static_cast<int64_t>(output.nbytes()),
                describe(Collective::AllGather, output));
}

std::shared_ptr<Work> SimulatedCommunicator::broadcast_async(const Tensor& t, int root, Stream) {
  check_buffer(t, "broadcast");
  check_root(root);
  return finish(Collective::Broadcast, static_cast<int64_t>(t.nbytes()),
                describe(Collective::Broadcast, t));
}

std::shared_ptr<Work> SimulatedCommunicator::send_async(const Tensor& t, int peer, int tag, Stream) {
  check_buffer(t, "send");
  check_peer(peer, tag, "send");
  return finish(Collective::Send, static_cast<int64_t>(t.nbytes()),
                describe(Collective::Send, t, fmt::format("tag {}", tag)));
}

std::shared_ptr<Work> SimulatedCommunicator::recv_async(const Tensor& t, int peer, int tag, Stream) {
  check_buffer(t, "recv");
  check_peer(peer, tag, "recv");
  return finish(Collective::Recv, static_cast<int64_t>(t.nbytes()),
                describe(Collective::Recv, t, fmt::format("tag {}", tag)));
}

std::shared_ptr<Work> SimulatedCommunicator::barrier_async() {
  return finish(Collective::Barrier, 0, "barrier");
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

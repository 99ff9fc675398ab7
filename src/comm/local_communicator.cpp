#include "comm/local_communicator.h"

#include "comm/detail.h"

#include <cstring>

namespace kiln {

using comm_detail::BasicWork;
using comm_detail::completed_work;
using comm_detail::describe;

LocalCommunicator::LocalCommunicator(std::string name, Backend* backend)
    : Communicator(std::move(name)), backend_(backend) {}

void LocalCommunicator::copy(Stream s, const Tensor& dst, const Tensor& src) {
  if (dst.raw() == src.raw() || dst.nbytes() == 0) return;
  if (backend_ != nullptr && !dst.device().is_cpu()) {
    backend_->copy(s, dst.reshape({dst.numel()}), src.reshape({src.numel()}));
    return;
  }
  KILN_CHECK(dst.device().is_cpu() && src.device().is_cpu(),
             "LocalCommunicator '{}': device tensors need a Backend for copies ({} <- {})", name(),
             dst.str(), src.str());
  std::memmove(dst.raw(), src.raw(), dst.nbytes());
}

std::shared_ptr<Work> LocalCommunicator::all_reduce_async(const Tensor& t, ReduceOp op, Stream) {
  check_buffer(t, "all_reduce");
  record(Collective::AllReduce, static_cast<int64_t>(t.nbytes()), 0.0);
  return completed_work(describe(Collective::AllReduce, t, reduce_op_name(op)));
}

std::shared_ptr<Work> LocalCommunicator::reduce_scatter_async(const Tensor& output,
                                                              const Tensor& input, Stream s) {
  check_reduce_scatter(output, input);
  copy(s, output, input);
  record(Collective::ReduceScatter, static_cast<int64_t>(input.nbytes()), 0.0);
  return completed_work(describe(Collective::ReduceScatter, input));
}

std::shared_ptr<Work> LocalCommunicator::all_gather_async(const Tensor& output,
                                                          const Tensor& input, Stream s) {
  check_all_gather(output, input);
  copy(s, output, input);
  record(Collective::AllGather, static_cast<int64_t>(output.nbytes()), 0.0);
  return completed_work(describe(Collective::AllGather, output));
}

std::shared_ptr<Work> LocalCommunicator::broadcast_async(const Tensor& t, int root, Stream) {
  check_buffer(t, "broadcast");
  check_root(root);
  record(Collective::Broadcast, static_cast<int64_t>(t.nbytes()), 0.0);
  return completed_work(describe(Collective::Broadcast, t));
}

std::shared_ptr<Work> LocalCommunicator::send_async(const Tensor& t, int peer, int tag, Stream) {
  check_buffer(t, "send");
  check_peer(peer, tag, "send");
  KILN_CHECK(t.device().is_cpu(), "send on {}: LocalCommunicator needs a host tensor, got {}",
             where(), t.str());
  record(Collective::Send, static_cast<int64_t>(t.nbytes()), 0.0);
  std::lock_guard<std::mutex> lock(mailbox_mu_);
  for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
    if (it->tag != tag) continue;
    KILN_CHECK(it->buffer.nbytes() == t.nbytes(),
               "send on {}: {} bytes sent with tag {}, but the matching recv expects {}", where(),
               t.nbytes(), tag, it->buffer.nbytes());
    std::memcpy(it->buffer.raw(), t.raw(), t.nbytes());
    static_cast<BasicWork&>(*it->work).complete();
    recvs_.erase(it);
    return completed_work(describe(Collective::Send, t, fmt::format("tag {}", tag)));
  }
  const auto* p = static_cast<const unsigned char*>(t.raw());
  messages_.push_back({tag, std::vector<unsigned char>(p, p + t.nbytes())});
  return completed_work(describe(Collective::Send, t, fmt::format("tag {}", tag)));
}

std::shared_ptr<Work> LocalCommunicator::recv_async(const Tensor& t, int peer, int tag, Stream) {
  check_buffer(t, "recv");
  check_peer(peer, tag, "recv");
  KILN_CHECK(t.device().is_cpu(), "recv on {}: LocalCommunicator needs a host tensor, got {}",
             where(), t.str());
  record(Collective::Recv, static_cast<int64_t>(t.nbytes()), 0.0);
  std::string desc = describe(Collective::Recv, t, fmt::format("tag {}", tag)) + " on " + where();
  std::lock_guard<std::mutex> lock(mailbox_mu_);
  for (auto it = messages_.begin(); it != messages_.end(); ++it) {
    if (it->tag != tag) continue;
    KILN_CHECK(it->bytes.size() == t.nbytes(),
               "recv on {}: expects {} bytes with tag {}, but {} were sent", where(), t.nbytes(),
               tag, it->bytes.size());
    std::memcpy(t.raw(), it->bytes.data(), t.nbytes());
    messages_.erase(it);
    return completed_work(desc);
  }
  auto work = std::make_shared<BasicWork>(desc, timeout());
  recvs_.push_back({tag, t, work});
  return work;
}

std::shared_ptr<Work> LocalCommunicator::barrier_async() {
  record(Collective::Barrier, 0, 0.0);
  return completed_work("barrier");
}

std::unique_ptr<Communicator> LocalCommunicator::make_group(const std::vector<int>&,
                                                            const std::string& name) {
  return std::make_unique<LocalCommunicator>(name, backend_);
}

std::unique_ptr<Communicator> LocalCommunicator::make_split(int, int, const std::string& name) {
  return std::make_unique<LocalCommunicator>(name, backend_);
}

}  // namespace kiln

#include "comm/local_communicator.h"

#include "comm/detail.h"

#include <cstring>

namespace kiln {

using comm_detail::BasicWork;
using comm_detail::completed_work;

LocalCommunicator::LocalCommunicator(std::string name, Backend* backend)
    : InProcessCommunicator(std::move(name)), backend_(backend) {}

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

std::shared_ptr<Work> LocalCommunicator::issue(const CheckedCall& call, Stream s) {
  switch (call.kind) {
    case Collective::ReduceScatter:
    case Collective::AllGather:
    case Collective::AllToAll: copy(s, call.buffer, call.input); break;
    case Collective::Send: return send_to_self(call);
    case Collective::Recv: return recv_from_self(call);
    case Collective::AllReduce:  // over one rank the buffer is the result already
    case Collective::Broadcast:
    case Collective::Barrier: break;
  }
  return completed_work(call.description);
}

std::shared_ptr<Work> LocalCommunicator::send_to_self(const CheckedCall& call) {
  const Tensor& t = call.buffer;
  KILN_CHECK(t.device().is_cpu(), "send on {}: LocalCommunicator needs a host tensor, got {}",
             where(), t.str());
  std::lock_guard<std::mutex> lock(mailbox_mu_);
  for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
    if (it->tag != call.tag) continue;
    KILN_CHECK(it->buffer.nbytes() == t.nbytes(),
               "send on {}: {} bytes sent with tag {}, but the matching recv expects {}", where(),
               t.nbytes(), call.tag, it->buffer.nbytes());
    std::memcpy(it->buffer.raw(), t.raw(), t.nbytes());
    static_cast<BasicWork&>(*it->work).complete();
    recvs_.erase(it);
    return completed_work(call.description);
  }
  const auto* p = static_cast<const unsigned char*>(t.raw());
  messages_.push_back({call.tag, std::vector<unsigned char>(p, p + t.nbytes())});
  return completed_work(call.description);
}

std::shared_ptr<Work> LocalCommunicator::recv_from_self(const CheckedCall& call) {
  const Tensor& t = call.buffer;
  KILN_CHECK(t.device().is_cpu(), "recv on {}: LocalCommunicator needs a host tensor, got {}",
             where(), t.str());
  std::string desc = call.description + " on " + where();
  std::lock_guard<std::mutex> lock(mailbox_mu_);
  for (auto it = messages_.begin(); it != messages_.end(); ++it) {
    if (it->tag != call.tag) continue;
    KILN_CHECK(it->bytes.size() == t.nbytes(),
               "recv on {}: expects {} bytes with tag {}, but {} were sent", where(), t.nbytes(),
               call.tag, it->bytes.size());
    std::memcpy(t.raw(), it->bytes.data(), t.nbytes());
    messages_.erase(it);
    return completed_work(desc);
  }
  auto work = std::make_shared<BasicWork>(desc, timeout());
  recvs_.push_back({call.tag, t, work});
  return work;
}

std::unique_ptr<Communicator> LocalCommunicator::make_group(const std::vector<int>&,
                                                            const std::string& name) {
  return std::make_unique<LocalCommunicator>(name, backend_);
}

std::unique_ptr<Communicator> LocalCommunicator::make_split(int, int, const std::string& name) {
  return std::make_unique<LocalCommunicator>(name, backend_);
}

}  // namespace kiln

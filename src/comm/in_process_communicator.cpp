#include "comm/in_process_communicator.h"

#include "comm/detail.h"

#include <fmt/format.h>

namespace kiln {

using comm_detail::describe;

std::shared_ptr<Work> InProcessCommunicator::count_and_issue(const CheckedCall& call, Stream s) {
  record(call.kind, call.bytes, 0.0);
  return issue(call, s);
}

std::shared_ptr<Work> InProcessCommunicator::all_reduce_async(const Tensor& t, ReduceOp op,
                                                              Stream s) {
  check_buffer(t, "all_reduce");
  return count_and_issue({.kind = Collective::AllReduce,
                          .bytes = static_cast<int64_t>(t.nbytes()),
                          .description = describe(Collective::AllReduce, t, reduce_op_name(op)),
                          .buffer = t},
                         s);
}

std::shared_ptr<Work> InProcessCommunicator::reduce_scatter_async(const Tensor& output,
                                                                  const Tensor& input, Stream s) {
  check_reduce_scatter(output, input);
  return scatter_or_gather(Collective::ReduceScatter, output, input, s);
}

std::shared_ptr<Work> InProcessCommunicator::all_gather_async(const Tensor& output,
                                                              const Tensor& input, Stream s) {
  check_all_gather(output, input);
  return scatter_or_gather(Collective::AllGather, output, input, s);
}

std::shared_ptr<Work> InProcessCommunicator::scatter_or_gather(Collective kind,
                                                               const Tensor& output,
                                                               const Tensor& input, Stream s) {
  // Counted and described by the full buffer: reduce_scatter's input, all_gather's output.
  const Tensor& full = kind == Collective::ReduceScatter ? input : output;
  return count_and_issue({.kind = kind,
                          .bytes = static_cast<int64_t>(full.nbytes()),
                          .description = describe(kind, full),
                          .buffer = output,
                          .input = input},
                         s);
}

std::shared_ptr<Work> InProcessCommunicator::broadcast_async(const Tensor& t, int root, Stream s) {
  check_buffer(t, "broadcast");
  check_root(root);
  return count_and_issue({.kind = Collective::Broadcast,
                          .bytes = static_cast<int64_t>(t.nbytes()),
                          .description = describe(Collective::Broadcast, t),
                          .buffer = t},
                         s);
}

std::shared_ptr<Work> InProcessCommunicator::send_async(const Tensor& t, int peer, int tag,
                                                        Stream s) {
  return point_to_point(Collective::Send, t, peer, tag, s);
}

std::shared_ptr<Work> InProcessCommunicator::recv_async(const Tensor& t, int peer, int tag,
                                                        Stream s) {
  return point_to_point(Collective::Recv, t, peer, tag, s);
}

std::shared_ptr<Work> InProcessCommunicator::point_to_point(Collective kind, const Tensor& t,
                                                            int peer, int tag, Stream s) {
  const char* what = collective_name(kind);  // "send", "recv"
  check_buffer(t, what);
  check_peer(peer, tag, what);
  return count_and_issue({.kind = kind,
                          .bytes = static_cast<int64_t>(t.nbytes()),
                          .description = describe(kind, t, fmt::format("tag {}", tag)),
                          .buffer = t,
                          .tag = tag},
                         s);
}

std::shared_ptr<Work> InProcessCommunicator::barrier_async() {
  return count_and_issue({.kind = Collective::Barrier, .bytes = 0, .description = "barrier"}, {});
}

std::shared_ptr<Work> InProcessCommunicator::all_to_all_async(
    const Tensor& output, const Tensor& input, std::span<const int64_t> send_counts,
    std::span<const int64_t> recv_counts, Stream s) {
  const auto [sent, received] = check_all_to_all(output, input, send_counts, recv_counts);
  const Tensor in = input.view_at(0, Shape{sent});
  return count_and_issue({.kind = Collective::AllToAll,
                          .bytes = static_cast<int64_t>(in.nbytes()),
                          .description = describe(Collective::AllToAll, in),
                          .buffer = output.view_at(0, Shape{received}),
                          .input = in},
                         s);
}

}  // namespace kiln

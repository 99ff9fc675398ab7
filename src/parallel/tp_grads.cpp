#include "parallel/tp_grads.h"

namespace kiln {

void reduce_partial_grads(const std::vector<AdamWSegment>& segments, Backend& backend,
                          Communicator& tp) {
  if (tp.size() == 1) return;
  const Stream s = backend.default_stream();
  for (const AdamWSegment& seg : segments)
    if (seg.spec.tp_partial_grad && seg.size() > 0) tp.all_reduce(seg.grad, ReduceOp::Sum, s);
}

void reduce_partial_grads(Model& model, Communicator& tp) {
  reduce_partial_grads(whole_segments(model.params(), model.param_buffer(), model.grad_buffer()),
                       model.backend(), tp);
}

double tp_share_sum_squares(const std::vector<AdamWSegment>& segments, Backend& backend,
                            int tp_rank) {
  const Stream s = backend.default_stream();
  double local = 0.0;
  for (const AdamWSegment& seg : segments)
    if (seg.size() > 0 && (seg.spec.tp.sharded() || tp_rank == 0))
      local += backend.sum_squares(s, seg.grad);
  return local;
}

double tp_grad_sum_squares(Model& model, Communicator& tp) {
  std::vector<double> v{tp_share_sum_squares(
      whole_segments(model.params(), model.param_buffer(), model.grad_buffer()), model.backend(),
      tp.rank())};
  tp.all_reduce_sum(v);
  return v[0];
}

}  // namespace kiln

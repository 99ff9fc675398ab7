#include "parallel/tp_grads.h"

#include "comm/ledger.h"

namespace kiln {

void reduce_partial_grads(const std::vector<AdamWSegment>& segments, Backend& backend,
                          Communicator& tp) {
  if (tp.size() == 1) return;
  const Stream s = backend.default_stream();
  const CommSite site("tp.all_reduce partial grads");
  for (const AdamWSegment& seg : segments)
    if (seg.spec.tp_partial_grad && seg.size() > 0) tp.all_reduce(seg.grad, ReduceOp::Sum, s);
}

void reduce_partial_grads(Model& model, Communicator& tp) {
  reduce_partial_grads(whole_segments(model.params(), model.param_buffer(), model.grad_buffer()),
                       model.backend(), tp);
}

void add_sum_squares(const std::vector<AdamWSegment>& segments, Backend& backend,
                     const Tensor& acc) {
  const Stream s = backend.default_stream();
  // Runs of segments adjacent in memory (a buffer's consecutive parameters) in one call.
  int64_t run_size = 0;
  Tensor first;
  auto flush = [&] {
    if (run_size > 0)
      backend.sum_squares(s, acc, Tensor::view(first.raw(), Shape{run_size}, first.dtype(),
                                               first.device()));
    run_size = 0;
  };
  for (const AdamWSegment& seg : segments) {
    if (seg.size() == 0) continue;
    const auto* p = static_cast<const char*>(seg.grad.raw());
    if (run_size > 0 && seg.grad.dtype() == first.dtype() &&
        p == static_cast<const char*>(first.raw()) +
                 run_size * static_cast<int64_t>(dtype_size(first.dtype()))) {
      run_size += seg.size();
      continue;
    }
    flush();
    first = seg.grad;
    run_size = seg.size();
  }
  flush();
}

void tp_share_sum_squares(const std::vector<AdamWSegment>& segments, Backend& backend,
                          int tp_rank, const Tensor& acc) {
  std::vector<AdamWSegment> mine;
  for (const AdamWSegment& seg : segments)
    if (seg.spec.slice.tp_sharded() || tp_rank == 0) mine.push_back(seg);
  add_sum_squares(mine, backend, acc);
}

double tp_grad_sum_squares(Model& model, Communicator& tp) {
  Backend& be = model.backend();
  const Tensor acc = be.empty(Shape{1}, DType::F64, MemCategory::Temporaries);
  be.fill(be.default_stream(), acc, 0.f);
  tp_share_sum_squares(whole_segments(model.params(), model.param_buffer(), model.grad_buffer()),
                       be, tp.rank(), acc);
  const CommSite site("tp.all_reduce grad norm");
  tp.all_reduce(acc, ReduceOp::Sum, be.default_stream());
  double v = 0.0;
  be.copy_to_host(be.default_stream(), &v, acc);
  return v;
}

}  // namespace kiln

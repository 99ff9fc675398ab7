#include "parallel/tp_grads.h"

#include <vector>

namespace kiln {

void reduce_partial_grads(Model& model, Communicator& tp) {
  if (tp.size() == 1) return;
  const Stream s = model.backend().default_stream();
  for (const ParamSpec& p : model.params())
    if (p.tp_partial_grad) tp.all_reduce(model.grad(p), ReduceOp::Sum, s);
}

double tp_grad_sum_squares(Model& model, Communicator& tp) {
  Backend& be = model.backend();
  const Stream s = be.default_stream();
  double local = 0.0;
  for (const ParamSpec& p : model.params()) {
    if (p.tp.sharded() || tp.rank() == 0) local += be.sum_squares(s, model.grad(p));
  }
  std::vector<double> v{local};
  tp.all_reduce_sum(v);
  return v[0];
}

}  // namespace kiln

// Test helper: a layer's parameters bound to views of one fp32 value buffer and one fp32
// gradient buffer, so a test can read, perturb and compare them all at once.
#pragma once

#include "nn/param.h"

#include <vector>

namespace kiln::nn {

struct Bound {
  Tensor values, grads;       // fp32 [sum of the parameters' sizes]
  std::vector<int64_t> offsets;  // each parameter's first element in them
};

/// Binds every parameter of `params` (value and gradient, zeroed) in order.
inline Bound bind_params(Backend& be, const std::vector<Param*>& params) {
  Bound b;
  int64_t n = 0;
  for (Param* p : params) b.offsets.push_back(n), n += p->shape.numel();
  b.values = be.empty(Shape{n}, DType::F32, MemCategory::Parameters);
  b.grads = be.empty(Shape{n}, DType::F32, MemCategory::Gradients);
  be.fill(be.default_stream(), b.grads, 0.f);
  for (size_t i = 0; i < params.size(); ++i) {
    params[i]->value = b.values.view_at(b.offsets[i], params[i]->shape);
    params[i]->grad = b.grads.view_at(b.offsets[i], params[i]->shape);
  }
  return b;
}

}  // namespace kiln::nn

// Test helpers for a layer's gradients: its parameters bound to one fp32 value buffer and
// one fp32 gradient buffer (so a test can read, perturb and compare them all at once), and
// the central difference of a loss in one element of a buffer.
#pragma once

#include "nn/param.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace kiln::nn {

struct Bound {
  Tensor values, grads;          // fp32 [sum of the parameters' sizes]
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

/// Every bound parameter at its initial values (init_values, seed 5) plus N(0, 0.1^2)
/// noise from `rng`, so that adaLN-Zero's and the biases' zeros do not hide gradients.
template <class Rng>
void perturb_initial_values(Backend& be, const Bound& bound, const std::vector<Param*>& params,
                            Rng& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(static_cast<size_t>(bound.values.numel()));
  for (size_t i = 0; i < params.size(); ++i) {
    auto v = init_values(*params[i], 5, i, 0, params[i]->shape.numel());
    for (size_t j = 0; j < v.size(); ++j) w[bound.offsets[i] + j] = v[j] + 0.1f * nd(rng);
  }
  upload_f32(be, bound.values, w.data());
}

/// (loss(v_i + h) - loss(v_i - h)) / 2h for element i of the fp32 buffer `buf`, which is
/// left as it was.
inline double central_difference(Backend& be, const Tensor& buf, size_t i,
                                 const std::function<double()>& loss, float h = 1e-2f) {
  auto v = download_f32(be, buf);
  const float v0 = v[i];
  v[i] = v0 + h;
  upload_f32(be, buf, v.data());
  const double lp = loss();
  v[i] = v0 - h;
  upload_f32(be, buf, v.data());
  const double lm = loss();
  v[i] = v0;
  upload_f32(be, buf, v.data());
  return (lp - lm) / (2 * h);
}

/// How far a backward gradient is from its finite difference, relative, with a floor of
/// 5e-2 (the fp32 noise of a difference at h = 1e-2).
inline double gradient_gap(double finite_difference, double backward) {
  return std::abs(finite_difference - backward) /
         std::max(5e-2, std::abs(finite_difference) + std::abs(backward));
}

}  // namespace kiln::nn

// AdamW (Loshchilov & Hutter 2019), one pass over the parameter: reads p, g, m, v once
// and writes p, m, v once, with torch.optim.AdamW's order of operations.
#include "backend/cpu/kernels.h"

#include <cmath>

namespace kiln::cpu {

template <class G>
void adamw(float* param, const G* grad, float* m, float* v, int64_t n, const AdamWParams& hp) {
  const float b1 = hp.beta1, b2 = hp.beta2;
  const float bc1 = 1.f - static_cast<float>(std::pow(static_cast<double>(b1), hp.step));
  const float bc2 = 1.f - static_cast<float>(std::pow(static_cast<double>(b2), hp.step));
  const float step_size = hp.lr / bc1;
  const float bc2_sqrt = std::sqrt(bc2);
  const float decay = 1.f - hp.lr * hp.weight_decay;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = load(grad[i]) * hp.grad_scale;
    const float mi = b1 * m[i] + (1.f - b1) * g;
    const float vi = b2 * v[i] + (1.f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + hp.eps);
  }
}

template void adamw<float>(float*, const float*, float*, float*, int64_t, const AdamWParams&);
template void adamw<bf16>(float*, const bf16*, float*, float*, int64_t, const AdamWParams&);
template void adamw<f16>(float*, const f16*, float*, float*, int64_t, const AdamWParams&);

}  // namespace kiln::cpu

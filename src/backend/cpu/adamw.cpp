// AdamW (Loshchilov & Hutter 2019), one pass over the parameter: reads p, g, m, v once
// and writes p, m, v once, with torch.optim.AdamW's order of operations. And the weights'
// exponential moving average (Backend::ema_update).
#include "backend/cpu/kernels.h"

#include <algorithm>
#include <cmath>

namespace kiln::cpu {

template <class G>
void adamw(float* param, const G* grad, float* m, float* v, int64_t n, const AdamWParams& hp) {
  const float b1 = static_cast<float>(hp.beta1), b2 = static_cast<float>(hp.beta2);
  const float omb1 = static_cast<float>(1.0 - hp.beta1), omb2 = static_cast<float>(1.0 - hp.beta2);
  // Bias corrections in double (as torch.optim.AdamW), rounded to fp32 once.
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  const auto step_size = static_cast<float>(static_cast<double>(hp.lr) / bc1);
  const auto bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.f - hp.lr * hp.weight_decay;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = load(grad[i]) * hp.grad_scale;
    const float mi = b1 * m[i] + omb1 * g;
    const float vi = b2 * v[i] + omb2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + hp.eps);
  }
}

template void adamw<float>(float*, const float*, float*, float*, int64_t, const AdamWParams&);
template void adamw<bf16>(float*, const bf16*, float*, float*, int64_t, const AdamWParams&);
template void adamw<f16>(float*, const f16*, float*, float*, int64_t, const AdamWParams&);

float clip_coefficient(double sumsq, double check, double max_norm, float loss_scale) {
  if (!std::isfinite(sumsq) || !std::isfinite(check)) return NAN;
  const double norm = std::sqrt(sumsq) / loss_scale;
  const float clip = max_norm <= 0.0 ? 1.f : static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
  return clip / loss_scale;
}

// The weights' moving average, one pass: ema read and written once, param read once.
template <class P>
void ema_update(float* ema, const P* param, int64_t n, float decay) {
  const auto take = static_cast<float>(1.0 - static_cast<double>(decay));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) ema[i] = decay * ema[i] + take * load(param[i]);
}

template void ema_update<float>(float*, const float*, int64_t, float);
template void ema_update<bf16>(float*, const bf16*, int64_t, float);
template void ema_update<f16>(float*, const f16*, int64_t, float);

}  // namespace kiln::cpu

// AdamW over one tensor in one launch (torch.optim.AdamW's order of operations, as the
// CPU backend). Parameters fp32 (e.g. the optimizer's master weights) or bf16, gradients
// fp32 or bf16, independently; m and v fp32.
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

struct AdamWArgs {
  float lr, beta1, beta2, eps, grad_scale;
  float step_size;  // lr / (1 - beta1^step)
  float bc2_sqrt;   // sqrt(1 - beta2^step)
  float decay;      // 1 - lr * weight_decay
  const float* scale;  // device fp32 [1] multiplying grad_scale, or nullptr; not finite: skip
};

void adamw(cudaStream_t s, Elem e, Elem g, void* param, const void* grad, float* m, float* v, int64_t n,
           const AdamWArgs& a);

/// One tensor of a multi-tensor launch.
struct AdamWSegment {
  void* param;        // element type e
  float* master;      // fp32 master weights (updated; param = rounded), or nullptr
  const void* grad;   // element type g
  float* m;
  float* v;
  int64_t n;
  float decay;        // 1 - lr * weight_decay of this tensor
};
/// Segments per launch: the kernel takes them as parameters (under the 4 KB limit).
constexpr int kAdamWMultiMax = 40;
/// adamw over `count` segments (all of parameter type e, gradient type g, and all with
/// or all without masters), in ceil(count / kAdamWMultiMax) launches; a.decay unused.
/// Per element the arithmetic of adamw(), then param = round(master) with a master.
void adamw_multi(cudaStream_t s, Elem e, Elem g, bool with_master, const AdamWSegment* segs,
                 int count, const AdamWArgs& a);

/// Backend::ema_update: ema fp32 [n] = decay * ema + one_minus_decay * param (param of
/// element type e), one launch.
void ema_update(cudaStream_t s, Elem e, float* ema, const void* param, int64_t n, float decay,
                float one_minus_decay);

}  // namespace kiln::cuda

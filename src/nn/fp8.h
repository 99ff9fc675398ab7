// fp8 training on a Linear (train.fp8 = "tensorwise", docs/fp8.md): the layer's three GEMMs
// (forward, input gradient, weight gradient) run on operands quantized to fp8 (the usual
// hybrid, Micikevicius et al. 2022: activations and weights in E4M3, output gradients in
// E5M2), each at a tensorwise scale from its current amax (torchao's float8 "tensorwise"
// recipe, with power-of-two scales: core/dtype.h fp8_scale). Accumulation and outputs
// stay in fp32/bf16; the backend runs the quantization and the GEMMs
// (Backend::fp8_linear_forward / _backward), the layer only takes the amaxes.
//
// Every layout computes the single process's scales: an amax is taken over the whole
// tensor of the micro-batch, so where the layout cuts a GEMM operand over ranks (a
// tensor-parallel weight, a row-parallel input, a column-parallel output gradient, a
// context-parallel chunk of the sequence) the layer reduces its amaxes with a max over
// those ranks (AmaxGroup) before quantizing. Data-parallel ranks hold micro-batches of
// their own, as the single process holds them one after another, so they reduce nothing.
#pragma once

#include "backend/backend.h"

namespace kiln::nn {

/// The ranks over which a micro-batch's tensors are cut (tensor x context parallel):
/// all_reduce_max makes t the element-wise max over them. Implemented outside nn
/// (src/train/fp8_plan.h) over the communicators.
class AmaxGroup {
 public:
  virtual ~AmaxGroup() = default;
  /// t fp32 on the device, the same size on every rank; every rank of the group calls it
  /// at the same point of the step.
  virtual void all_reduce_max(Stream s, const Tensor& t) = 0;
};

/// A Linear's fp8 settings (Linear::set_fp8), made by the fp8 plan. Tensorwise (current)
/// scaling: each call takes its operands' amaxes into `amax` and reduces them over
/// `group`. Delayed scaling (`step_amax` set; Transformer Engine's DelayedScaling): the
/// GEMMs scale by `amax` as the plan derived it from the amax history of earlier steps,
/// and each call only max-accumulates its operands' amaxes into `step_amax`, which the plan
/// reduces over every rank and pushes into the history once per step.
struct Fp8Linear {
  Tensor amax;                 // fp32 [3] on the device: the amaxes of inp, weight, dout the
                               // GEMMs scale by
  Tensor step_amax;            // delayed: fp32 [3], this step's amaxes so far; empty: tensorwise
  const bool* recording = nullptr;  // delayed: record into step_amax only while *recording
                                    // (a training step's passes, not evaluation or sampling)
  AmaxGroup* group = nullptr;  // tensorwise: reduce each call's amaxes over these ranks
};

}  // namespace kiln::nn

// The gradients of a tensor-parallel model as an update needs them (Megatron-LM's
// finalize step for tp): each partial sum reduced over tp exactly once, and the gradient
// norm counting every element of the single process once.
#pragma once

#include "comm/communicator.h"
#include "models/model.h"

namespace kiln {

/// all_reduce over `tp` of every gradient marked ParamSpec::tp_partial_grad (the norms'
/// gains and shifts under sequence parallelism), in parameter order. Call once per update,
/// after the last backward; with tp of one rank it does nothing.
void reduce_partial_grads(Model& model, Communicator& tp);

/// The sum of squares of the model's gradients as the single process has them: each
/// tp-sharded tensor's share summed over tp, each replicated tensor once (tp rank 0's).
/// Reduced in double (Communicator::all_reduce_sum). Collective over `tp`; call after
/// reduce_partial_grads.
double tp_grad_sum_squares(Model& model, Communicator& tp);

}  // namespace kiln

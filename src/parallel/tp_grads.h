// The gradients of a tensor-parallel model as an update needs them (Megatron-LM's
// finalize step for tp): each partial sum reduced over tp exactly once, and the gradient
// norm counting every element of the single process once. DataParallel calls these on
// its optimizer segments (so they compose with ZeRO: each rank treats the slices it
// updates); the Model overloads cover a model's whole buffers.
#pragma once

#include "comm/communicator.h"
#include "models/model.h"
#include "optim/adamw.h"

#include <vector>

namespace kiln {

/// all_reduce over `tp` of the gradient of every segment whose parameter is marked
/// ParamSpec::tp_partial_grad (the norms' gains and shifts under sequence parallelism), in
/// segment order. Every tp rank holds the same segments (equal local layouts). Call once
/// per update, after the last backward; with tp of one rank it does nothing.
void reduce_partial_grads(const std::vector<AdamWSegment>& segments, Backend& backend,
                          Communicator& tp);
void reduce_partial_grads(Model& model, Communicator& tp);

/// acc fp64 [1] (on the device) += the sum of squares of the segments' gradients
/// (Backend::sum_squares; segments adjacent in memory in one call). Not collective.
void add_sum_squares(const std::vector<AdamWSegment>& segments, Backend& backend,
                     const Tensor& acc);
/// acc += this tp rank's share of it: a tp-sharded tensor's elements on every rank, a
/// replicated tensor's on tp rank 0 only, so that the sum over tp counts each element of
/// the single process once. Not collective.
void tp_share_sum_squares(const std::vector<AdamWSegment>& segments, Backend& backend,
                          int tp_rank, const Tensor& acc);
/// The whole model's, read back to the host: tp_share_sum_squares over its buffers,
/// all_reduced over `tp` in double. Collective over `tp`; call after reduce_partial_grads.
double tp_grad_sum_squares(Model& model, Communicator& tp);

}  // namespace kiln

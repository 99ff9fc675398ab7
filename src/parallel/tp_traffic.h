// The tensor-parallel traffic of a training step by formula (Megatron-LM's count,
// Korthikanti et al. 2022 section 4.2.2), to set against what the tp communicator
// measured (`kiln bench` under mpirun prints both). The formula is that of the decoders'
// plan table (kDecoderParallelTables, models/decoder_model.h); a family that states
// another (tests/models/tiny_encoder.cpp: a replicated head, no vocab-parallel loss)
// moves other traffic. Per micro-step, L layers, N = B*T
// rows, C features, an activation being N*C elements of the model dtype:
//
//   without sequence parallelism   all_reduce     4L + 2 activations: per layer 2 forward
//                                                 (attention and MLP outputs) and 2 backward
//                                                 (their inputs' gradients), plus the
//                                                 vocab-parallel embedding's output and the
//                                                 loss's input gradient
//   with sequence parallelism      reduce_scatter 4L + 2 (the same reductions, row-split)
//                                  all_gather     6L + 2: 2L forward (column inputs), 4L
//                                                 backward (row-parallel output gradients,
//                                                 column inputs gathered again instead of
//                                                 kept), the head's input, the embedding's
//                                                 output gradient
//   full activation checkpointing  + the blocks' forward collectives again (2L all_reduce,
//                                  or 2L all_gather + 2L reduce_scatter)
//   the vocab-parallel loss        all_gather of 3 fp32 statistics per row and rank, one
//                                  call per chunk of rows (nn::classifier_chunk_rows)
//
// Per update, once: the partial gradients of the norms under sequence parallelism (one
// all_reduce per parameter slice the rank updates, grad dtype) and the gradient norm's
// square (an all_reduce of one fp64 on the device).
#pragma once

#include "comm/communicator.h"

#include <array>
#include <cstdint>
#include <string>

namespace kiln {

struct TpTrafficShape {
  int64_t n_layer = 0, rows = 0, n_embd = 0;  // L, N = micro_batch * seq_len, C
  // A pipeline stage: L counts its blocks; the "+ 2" terms are one for the embedding and
  // one for the head (the loss statistics too), each where the stage holds it.
  bool has_embedding = true, has_head = true;
  int64_t padded_vocab = 0;                   // Vp (the loss's chunking)
  double classifier_chunk_mb = 16.0;          // the chunk (train.classifier_chunk_mb)
  int tp = 1;
  bool sequence_parallel = false;
  bool full_recompute = false;          // train.activation_checkpointing = "full"
  int64_t act_bytes = 4;                // bytes per activation element (model dtype)
  int64_t partial_grad_elems = 0;       // elements of the tp_partial_grad parameters
  int64_t partial_grad_params = 0;      // how many such parameters
  int64_t grad_bytes = 4;               // bytes per gradient element
};

/// Calls and bytes (as CommStats counts them) per collective.
struct TpTraffic {
  std::array<int64_t, kNumCollectives> calls{}, bytes{};
  int64_t& calls_of(Collective c) { return calls[static_cast<size_t>(c)]; }
  int64_t& bytes_of(Collective c) { return bytes[static_cast<size_t>(c)]; }
};

/// One micro-step's forward and backward.
TpTraffic tp_micro_step_traffic(const TpTrafficShape& s);
/// One update of `micro_steps` micro-steps: their traffic plus the gradient sync's.
TpTraffic tp_update_traffic(const TpTrafficShape& s, int micro_steps);

}  // namespace kiln

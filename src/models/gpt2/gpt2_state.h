// GPT-2's private state: saved activations for training and KV caches for decoding.
// Included only by the model's own .cpp files.
#pragma once

#include "models/gpt2/gpt2.h"

#include <vector>

namespace kiln {

// Saved activations (what backward reads) and backward scratch, for one (B, T).
struct GPT2::Activations {
  int B = 0, T = 0;
  struct Layer {
    Tensor ln1, ln1_mean, ln1_rstd;  // [B,T,C], [B*T], [B*T]
    Tensor qkv;                      // [B,T,3C]
    Tensor atty, lse;                // [B,T,C], [B,NH,T]
    Tensor residual2;                // [B,T,C]  x + attn
    Tensor ln2, ln2_mean, ln2_rstd;  // [B,T,C], [B*T], [B*T]
    Tensor fch, fch_gelu;            // [B,T,4C]
    Tensor residual3;                // [B,T,C]  block output
  };
  Tensor encoded;  // [B,T,C] embeddings (after dropout): the residual stream's start
  // Per block what backward reads. With full checkpointing only residual3 (the block's
  // output, the next block's input) is kept per block; with selective, all but
  // fch_gelu. What is not kept lives in `work`, one block's worth, recomputed in
  // backward (Korthikanti et al. 2022).
  std::vector<Layer> layers;
  Layer work;
  ActivationCheckpointing mode = ActivationCheckpointing::None;
  Tensor lnf, lnf_mean, lnf_rstd;
  Tensor logits_chunk, losses_chunk;  // [R,Vp], [R]
  // Backward scratch.
  Tensor dresidual, tmp, dtmp, datty;  // [B,T,C]
  Tensor dbig;                         // [B,T,4C]; also holds dqkv [B,T,3C]
  Tensor tokens, targets;              // the last forward's inputs (views)
  bool have_grad = false;
};

struct GPT2::DecodeState {
  int B = 0, max_len = 0, past = 0;
  std::vector<Tensor> k_cache, v_cache;  // per layer [B,max_len,C]
};

}  // namespace kiln

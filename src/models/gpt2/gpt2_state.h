// GPT-2's private state: saved activations for training and KV caches for decoding.
// Included only by the model's own .cpp files.
#pragma once

#include "models/gpt2/gpt2.h"
#include "nn/block.h"
#include "nn/classifier.h"

#include <vector>

namespace kiln {

// Saved activations (what backward reads) and backward scratch, for one (B, T).
struct GPT2::Activations {
  int B = 0, T = 0;
  // The residual stream, always kept: [0] the embeddings (after dropout), [1 + l] block
  // l's output (block l+1's input), each [B,T,C], or the rank's [B*T/tp, C] rows under
  // sequence parallelism.
  std::vector<Tensor> stream;
  // The blocks' own saved tensors under the checkpointing policy (nn/saved.h).
  nn::SavedActivations saved;
  std::vector<Tensor> head;           // ln_f's saved out [B,T,C], mean, rstd [B*T]
  nn::HeadScratch head_scratch;       // the loss's chunk buffers ([R,Vp], or [R,Vp/tp])
  Tensor dresidual;                   // [B,T,C] backward's residual-stream gradient
  nn::BlockScratch scratch;           // shared by the blocks; dtmp also holds dL/d(ln_f out)
  Tensor tokens, targets;             // the last forward's inputs (views)
  bool have_grad = false;
};

struct GPT2::DecodeState {
  int B = 0, max_len = 0, past = 0;
  std::vector<Tensor> k_cache, v_cache;  // per layer [B,max_len,C]
};

}  // namespace kiln

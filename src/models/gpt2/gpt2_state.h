// GPT-2's private state: KV caches for decoding (training state: DecoderModel).
// Included only by the model's own .cpp files.
#pragma once

#include "models/gpt2/gpt2.h"

#include <vector>

namespace kiln {

struct GPT2::DecodeState {
  int B = 0, max_len = 0, past = 0;
  std::vector<Tensor> k_cache, v_cache;  // per layer [B,max_len,C]
};

}  // namespace kiln

// The tiny decoders tests build through the registry: 2 blocks of C = 16 over 2 heads,
// context 12, vocabulary 29; Llama with grouped-query attention (1 key/value head) and a
// SwiGLU MLP of 24 units, GPT-2 with its GELU MLP.
#pragma once

#include "models/model_options.h"

#include <string>

namespace kiln::testing {

inline ModelOptions tiny_decoder(const std::string& arch) {
  ModelOptions o;
  o.arch = arch;
  o.n_layer = 2;
  o.n_head = 2;
  o.n_embd = 16;
  o.block_size = 12;
  o.vocab_size = 29;
  if (arch == "llama") o.family = {{"n_kv_head", 1}, {"ffn_hidden_size", 24}};
  return o;
}

}  // namespace kiln::testing
